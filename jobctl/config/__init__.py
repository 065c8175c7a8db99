"""Reading recipes and inventories: YAML (omegaconf), pydantic schemas, file:line errors, the cache."""
