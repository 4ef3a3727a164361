"""The small core every other layer may use: atomic files and content fingerprints, text helpers
(thinking vs answer, answer extraction, language by script), prompt templates. Imports nothing of
the project."""
