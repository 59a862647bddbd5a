# Sourced by scripts/sanitize.sh and scripts/arm.sh: the per-target test
# suites that make only f32 calls.  On a native bf16 target (AMX_BF16,
# AVX512_BF16, NEON_BF16) they run the build's best Highway target, which
# runs them already under its own name, so the slower runs leave them out
# there.
# shellcheck disable=SC2034  # used by the scripts that source this file
f32_only_suites='(Attention|QkScores|SoftmaxV|ProjectHeadsSum|ProjectHeadsSumEx|ProjectHeadsSumPacked|HeadContributionNorms|HeadAttribution|PerHead|Numerics|FullyMaskedRows)'
