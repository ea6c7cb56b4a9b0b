"""E2, E3: train.bank_check with the confidence feature imputed (a waiting seat gets the mean of the held confidences;
none held: 0.85), so that the spread of the held values survives the running standardisation. Run from the checkout:
    PYTHONPATH=. python results/bank-check-gsm8k-long-cw-ablations/imputed_confidence.py --config gsm8k-long ..."""
import sys, math, torch
import dear.regulator as R
from dear.confidence import record_of

def held(d, agent):
    for turns in reversed(d.trace.rounds):
        turn = turns[agent]
        if turn.silent and not turn.waiting:
            continue
        record = record_of(turn.confidence) if turn.answer_key is not None else None
        return math.exp(record.mean_logprob) if record is not None else None
    return None

def confidence_features(debates):
    rows = []
    for d in debates:
        vals = [held(d, i) for i in range(d.n_agents)]
        have = [v for v in vals if v is not None]
        fill = sum(have) / len(have) if have else 0.85
        rows.append([fill if v is None else v for v in vals])
    return torch.tensor(rows, dtype=torch.float32)

R.confidence_features = confidence_features
from train import bank_check
sys.exit(bank_check.main(sys.argv[1:]))
