"""Drafter training for any target: data from the target run teacher-forced, composable losses, one loop.

    from smcsd.train import TextCorpus, distill_ar_drafter, draft_config_for
    corpus = TextCorpus(files=["docs/"], tokenizer=target.tokenizer, seq_len=256, batch_size=8)
    res = distill_ar_drafter(target, draft_config_for(target.config, hidden=128), corpus, steps=1000,
                             out="drafter/", ckpt_dir="drafter-ckpt", cache_dir="teacher-cache")

- `data`: `TextCorpus` (packed rows, step-deterministic batches, held-out split), `TeacherStream`
  (tokens, target log-probs top-k or full, hidden states of chosen layers; optional float16 disk cache),
  `check_vocab`.
- `losses`: CE, forward KL (full / top-k), block-position weights (uniform, DFlash, D-PACE, PARD-2 CAT),
  SpecBlock's valid-prefix mask, `weighted_mean`; for SMC proposals reverse KL, Rényi-α (α = 2: log(1 + χ²)) and
  their mix with forward KL, block-level forms (`block_renyi_mc`, `block_sum`) and the draft-vocabulary floor
  mixture `floor_mixture_logq`.
- `loop`: `train` (AdamW, warmup + cosine, clipping, exact orbax resume, tqdm, JSON + PNG curves),
  `export_model`, and the AR-drafter recipe `distill_ar_drafter`; `placement(mesh)` -> `Placement`, the device-mesh
  layout every recipe's `mesh=` uses (rows over "data", the frozen target over "model", the drafter replicated;
  docs/training_at_scale.md).
- `block`: the block-drafter (DFlash) recipe `train_block_drafter` with DFlash, D-PACE or uniform position
  weights over many anchored blocks per sequence in one pass.
- `local`: DeLS-Spec's local head `train_local_head` (next-token CE over short windows; target and block drafter
  untouched).
- `specblock`: SpecBlock's `train_specblock` (chained blocks, valid-prefix mask, 0.8^k KL).
- `flex`: FlexDraft's `train_flex` (mask adapters, mask vector and calibration MLP; the target frozen).
- `cli`: the `train-drafter` subcommand (`add_parser`, `run`).
"""

from . import losses
from .dflash import train_block_drafter
from .dels import train_local_head
from .specblock import train_rank_head, train_specblock
from .flex import train_flex
from .data import TeacherStream, TextCorpus, check_vocab, params_fingerprint, read_texts
from .loop import (Objective, Placement, TrainResult, ar_distill_loss, checkpoint_manager, distill_ar_drafter, draft_config_for,
                   export_model, flatten_params, make_optimizer, placement, restore_checkpoint, save_checkpoint,
                   save_curves, train)

__all__ = [
    "Objective", "Placement", "TeacherStream", "TextCorpus", "TrainResult", "ar_distill_loss", "check_vocab", "checkpoint_manager",
    "distill_ar_drafter", "draft_config_for", "export_model", "flatten_params", "losses", "make_optimizer",
    "params_fingerprint", "placement", "read_texts", "restore_checkpoint", "save_checkpoint", "save_curves", "train",
    "train_block_drafter", "train_flex", "train_local_head", "train_rank_head", "train_specblock",
]
