"""posttrain's orchestration layer: recipes, the Prefect flow, launching, tracking and the CLI."""
