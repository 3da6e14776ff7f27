"""Detector thresholds, each with the reason for its value."""

#: A loop is a repeating tail of at least this many tokens (and 3 periods): shorter repeats
#: occur in healthy code and prose (indentation, closing brackets).
LOOP_MIN_TOKENS = 24
#: Longest loop period looked for (tokens).
LOOP_MAX_PERIOD = 32
#: A pattern must hold in this share of the blocks it is measured on to be called systematic.
SYSTEMATIC = 0.5
#: Fewest blocks a rate-based verdict is drawn from.
MIN_BLOCKS = 3
#: Below this share, proposal mismatches are reported as a warning (possible numerical ties).
MISMATCH_ERROR_RATE = 0.02
#: A drafter's or target's top-1 minus top-2 logit below this is a near-tie: fp32 kernels that
#: sum in another order differ by ~1e-5 relative on these logits, so a flip there is numerics.
NEAR_TIE_MARGIN = 0.01
#: depth_divergence: the conditional agreement at the break slot is at most this share of
#: the lowest earlier slot's (a healthy pair's conditional curve stays flat).
DEPTH_BREAK_DROP = 0.5
#: A concentration of mismatches (after a verdict, at a batch change) below the rate
#: thresholds is still called when its one-sided Fisher exact p-value is at most this (the
#: detectors test a handful of groups each; a chance concentration this strong is rarer than
#: one pair in ten thousand) and the group's rate is CONCENTRATION_RATIO times the rest's.
CONCENTRATION_P = 1e-4
CONCENTRATION_RATIO = 5.0
#: vocab_mapping from the id range alone: fewest of their proposed ids at or above our
#: highest id's power-of-two bound, and the least share of theirs that lies there.
RANGE_MIN_IDS = 20
RANGE_MIN_SHARE = 0.1
