"""Run health (DESIGN.md, "Run health"): detectors over a run's recent points
(``detectors``), alerts that open and resolve (``monitor``), their delivery to webhooks
(``webhooks``), and thresholds (``thresholds``: imported by the SDK too, so this package
imports nothing of its own here)."""
