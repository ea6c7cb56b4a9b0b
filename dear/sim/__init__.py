"""The simulated world (`sim`): synthetic debaters — a documented stochastic population model, no language model.

Everything it produces is labelled synthetic: ``model_id = "sim-v1"``, ``synthetic = True``, every log line
starts with ``[synthetic]``. It is for fast tests and algorithm checks (thousands of debates per minute on one
CPU core), never for reporting LLM results.

How it acts
-----------
It reads ``ChatRequest.metadata`` set by the debate engine (``agent``, ``round``, ``own_answer``,
``peer_answers``, ``question_text``), not the prompt. The question's facts come from a machine-readable
header on the first line of a ``synthetic`` task question (see ``dear/tasks/synthetic.py``)::

    [synthetic id=train-000017 difficulty=0.42 answer=731 distractors=118,402,655]

Notation: agent a has skill s_a (``skills[a % len(skills)]``, logits; a is the agent's pool position,
``metadata["pool_index"]``, when a debate seats its profiles in a shuffled order); the question has difficulty δ ∈ (0, 1)
from the header and difficulty logit d = c + k·logit(δ) (c = ``difficulty_center``, k = ``difficulty_scale``;
δ is uniform in the synthetic task, so d is logistic-distributed across questions). σ is the logistic
function. The sampling "excess" of a request with temperature T and top-p P is

    x = (T − T0) + w_p·(P − P0)                 (T0 = ``t_ref``, P0 = ``top_p_ref``, w_p = ``top_p_weight``)

so top-p below P0 acts like a slightly lower temperature (less randomness) and x = 0 at the reference.

Round 0 (and every "re-solve" below) is an independent draw; so is a fresh turn (``metadata["fresh"]``, an
independent sample from the question alone in a later round), without the re-solve bonus:

    P(correct) = σ(s_a − d − τ·x [+ β on a re-solve])          (τ = ``temp_penalty``, β = ``resolve_bonus``)

A wrong draw is the question's i-th distractor with probability (1 − u)·softmax(−λ·i) (λ =
``distractor_decay``: the first distractor is the popular mistake, so wrong majorities form), or with
probability u (``p_unique_wrong``) an idiosyncratic wrong number nobody else is likely to give. A question
is a trap with probability σ(logit(π) + γ·(d − c)) (π = ``trap_share``, γ = ``trap_slope``; drawn once per
question): there a wrong draw first goes to the first distractor (the question's popular mistake) with probability
ρ (``trap_pull``), so some questions, mostly hard ones when γ > 0, gather a wrong majority while others scatter
their wrong answers, as real ones do (π = 0: no traps).

Round r ≥ 1. Let n_agr / n_dis be how many of the peers shown in the prompt (``peer_answers``; peers without an
answer are ignored) share / do not share the agent's previous answer. The agent *moves* with probability

    reads nobody:   σ(s0 + s1·x)                                   (self-revision; s0 ≪ 0)
    reads peers:    σ(a0 + a1·n_dis − a2·n_agr + a3·x)             (conformity pressure)

If it moves and n_dis > 0 it adopts the plurality of the disagreeing peers' answers (ties broken at random:
blind conformity, the source of correct→incorrect flips of a correct minority), except that with probability
ρ (``p_resolve``) it instead re-solves (independent redraw, the source of incorrect→correct by
reconsideration). If it moves with n_dis = 0 (nobody or only agreeing peers read) it re-solves. An agent whose
previous answer was missing always re-solves. Otherwise it keeps its answer. Consequences by design:
reading only agreeing peers almost never moves an agent (σ(a0 − a2) ≈ 0.5 %), an isolated correct minority that
reads nobody keeps its answer with probability ≈ 1 − σ(s0)·(1 − P(correct)), and lower temperature lowers
every move probability (a3, s1 > 0) — so a regulator that prunes who-reads-whom and cools the sampling can
beat full-mesh MAD. Defaults reproduce, at T = 0.7 with a full mesh and 3 agents, these GSM8K statistics of the
embedded model: round-0 accuracy ≈ 0.4, about a third of questions unanimous at round 0,
C→I ≈ 3/28 and I→C ≈ 10/44 over one exchange round (checked in tests/dear/sim/test_sim.py).

Text
----
"Reasoning: …\\nConclusion: The answer is X …\\nFinal answer: \\boxed{X}". The reasoning words come mostly
from a vocabulary derived deterministically from the answer X (stable hash), plus topic words of the question
(shared by everyone) and noise words from the agent's style and the sampling (more at higher T), so embeddings
of agents with the same answer are much closer than of agents with different answers. Length in words grows
with T (``words_base + words_per_temp·T``, ≈ 60–150, normal with sd ``words_sd``, clipped to 30–400). Token counters: prompt_tokens = characters of all messages
/ ``prompt_chars_per_token`` (4 by default); with ``text_chars_per_token`` = 0 (default) completion_tokens is the
word count, with c > 0 (the fit's value) a completion of n tokens is written about n·c characters long, so a sim
text counts in a later prompt what a real completion of its length counts. A completion longer than the request's ``max_tokens`` is cut there with
``finish_reason = "length"`` and loses its conclusion and final answer, as a real model's would. An agent
whose profile's reply style writes no reasoning (request metadata ``style`` in ``ANSWER_ONLY_STYLES``: ``direct``)
writes ``Final answer: X`` alone, as the real one does, counted by the same characters per token.

Real texts (option ``text_bank``): on real texts the encoder separates agreeing from differing pairs far less
than on the pseudo-words above (the separation d′ that ``python -m simworld.evidence_match`` reports). With a text bank (a gzip JSON built
from a real debate corpus by ``python -m simworld.evidence_match``: per real question, its distinct parsed answers,
each with the real completions that gave it), the decision and the token count stay the sim's, but the text is
a real completion: the synthetic question maps to one bank question (stable hash of its id), the sim's gold
answer to that question's correct answer class, the i-th distractor to its i-th wrong class, an idiosyncratic
answer to a wrong class by hash; the agent takes a text of that class (by stable hash, distinct agents get
distinct texts when the class has enough) and its final answer is rewritten to the sim's answer. So two agents
with equal sim answers show two real texts that gave the same answer to one question, and two agents with
different answers show real texts with different answers to one question: real agreeing / differing pairs.
A corpus of a few debates per question holds one or two texts for most classes, so whole texts would make two
agreeing agents show the identical text (e_ij = 1) far more often than real agents do. Hence the text is
recombined at the sentence level (sentences and lines): each reasoning sentence is replaced, with probability
``bank_sentence_mix``, by a random sentence of any text of the same bank question, else kept with probability
``bank_sentence_keep`` (the last sentence, the conclusion, always stays). Both are fitted by
``simworld.evidence_match`` to the real e_ij distributions; 1 and 0 give the whole completion. A bank that says
``"rewrite_answers": true`` (every bank ``simworld.evidence_match`` writes now; the GSM8K world's older bank does
not) also rewrites its class's real answer to the sim's wherever the text states it
(``dear.sim.bank.rewrite_answer``), so agents that agree state the same number: what an answer-only agent's line
can be compared with.

Randomness: one ``numpy.random.Generator`` per request, seeded by (backend seed, request seed, a stable hash
of question id / agent / round), so the same requests with the same seeds give bit-identical completions in any
batch order. Requests without a seed use a stable hash of their messages instead.

Fault injection
---------------
``SimBackend(fail_rate=p)`` (spec option ``llm.options.fail_rate``) makes each request fail with probability p,
the way a real backend reports a request it gave up on: a Completion with ``error`` set and
``finish_reason = "error"``. Whether a request fails is drawn from its own generator (same seeds as above, plus a
fixed tag), so failures are deterministic per request, independent of batch order, and the answers of the
requests that do not fail are unchanged. ``fail_rate=1`` is a dead backend.

Modules
-------
``params`` (``SimParams``), ``model`` (the equations above), ``text`` (the pseudo-word texts), ``bank`` (the text
bank), ``backend`` (``SimBackend``, the world behind ``dear.llm.base.Backend``; ``make_backend("sim")``),
``records`` (logged debates and their transitions) and ``likelihood`` (the model's likelihood of them, which
``simworld.fit`` maximises). Fitting, collecting corpora and matching evidence are the ``simworld`` application.
"""

from dear.sim.backend import SimBackend, TurnDecision, meta_round
from dear.sim.bank import TextBank
from dear.sim.model import (
    N_DISTRACTORS,
    difficulty_logit,
    distractor_weights,
    excess,
    kappa_of,
    logit,
    p_correct,
    p_move,
    sigmoid,
)
from dear.sim.params import LOG_PREFIX, SIM_MODEL_ID, SimParams
from dear.sim.text import PSEUDO_WORD_CHARS, TEXT_OVERHEAD_TOKENS, VOCAB
from dear.synthetic_header import SyntheticHeader, format_header, parse_header

__all__ = [
    "LOG_PREFIX", "N_DISTRACTORS", "PSEUDO_WORD_CHARS", "SIM_MODEL_ID", "TEXT_OVERHEAD_TOKENS", "VOCAB",
    "SimBackend", "SimParams", "SyntheticHeader", "TextBank", "TurnDecision", "difficulty_logit",
    "distractor_weights", "excess", "format_header", "kappa_of", "logit", "meta_round", "p_correct", "p_move",
    "parse_header", "sigmoid",
]
