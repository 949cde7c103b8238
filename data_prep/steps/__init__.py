"""The per-document steps (datatrove style: one class with ``run()`` over documents, a drop booked
with its reason) and what they compute with: normalize, language check, quality filter and its
scores, PII redaction, decontamination, the MinHash signature."""
