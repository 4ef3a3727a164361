"""The toolkit the stage kinds and data curation are built from; it imports nothing above it.

- `core`: the small base: atomic files and checksums, content fingerprints of code and data, text
  helpers (thinking vs answer, answer extraction, language by script), chat and prompt templates,
  interval statistics. Imports nothing of the project.
- `rewards`: rewards and verifiers behind a name registry, with the bubblewrap sandbox that runs
  model-written code. Imports `core` only.
- `rollouts`: one interface over the generation engines (HF, CTranslate2, vLLM) for everything that
  samples from a model. Imports `core` only; `rewards` and `rollouts` do not know each other.
"""
