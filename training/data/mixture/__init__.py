"""The language mixture while training runs: the blend rules (blend), the online controller
(controller), the two mixtures as the trainer runs them (fixed, online) and their decision log (log)."""
