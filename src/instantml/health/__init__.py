"""Run health (docs/reference.md, "Run health"): detectors over a run's recent points
(``detectors``), alerts that open and resolve (``monitor``) and their delivery to webhooks
(``webhooks``). The thresholds they read are ``instantml.thresholds``, which the SDK
checks too."""
