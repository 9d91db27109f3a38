"""The keys of the papers' claims (``analysis.claim_checks``), in report order: the one list the reports'
registry and the claims table share. Imports nothing, so listing reports stays cheap; a test compares it
with the registered claims."""

ALL_CLAIMS = (
    "troll_success",
    "troll_kl_bound",
    "trm_bound",
    "gtpo_conflict",
    "repo_r_entropy",
    "adapo_success",
    "tppo_time",
)
