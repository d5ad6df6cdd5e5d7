"""evo-sdpa: the library under the pipeline stages (config, variants, measuring, reporting)."""
