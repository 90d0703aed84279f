"""The kit's error types. Each names what is wrong and where, so a CLI can print it as one line."""


class RelibraError(Exception):
    """Base of every error the kit raises on bad input; the CLI prints it as `error: ...`."""


class TraceError(RelibraError):
    """A routing trace (or a file meant to hold one) is malformed."""


class PlanError(RelibraError):
    """A StepPlan breaks an invariant, or a policy was asked for something impossible."""


class ConfigError(RelibraError):
    """An unknown preset, an impossible topology or a bad parameter."""
