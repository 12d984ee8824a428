"""Environment variables between the launcher (`job`) and the wrapped workers (`worker`)."""

ENV_MARKS = "ACCELPACT_CHAOS_MARKS"
ENV_DWELL = "ACCELPACT_CHAOS_DWELL"
ENV_DWELL_S = "ACCELPACT_CHAOS_DWELL_S"
ENV_NODE = "ACCELPACT_CHAOS_NODE"
