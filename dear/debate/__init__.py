"""Floor 2: the batched multi-agent debate engine, its prompts, protocols and traces (on dear.llm + dear.tasks)."""

from dear.debate.engine import (
    Debate,
    DebateConfig,
    DebateEngine,
    EngineStats,
    RoundControl,
    RunSummary,
    summarize,
)
from dear.debate.profiles import AgentProfile, parse_profiles
from dear.debate.protocols import (
    FixedMaskProtocol,
    MADProtocol,
    MajorityProtocol,
    Protocol,
    RandomMaskProtocol,
    make_protocol,
)
from dear.debate.trace import AgentTurn, DebateTrace, read_jsonl, write_jsonl
from dear.vote import VoteResult

__all__ = [
    "AgentProfile", "AgentTurn", "Debate", "DebateConfig", "DebateEngine", "DebateTrace", "EngineStats",
    "FixedMaskProtocol", "MADProtocol", "MajorityProtocol", "Protocol", "RandomMaskProtocol", "RoundControl", "RunSummary",
    "VoteResult", "make_protocol", "parse_profiles", "read_jsonl", "summarize", "write_jsonl",
]
