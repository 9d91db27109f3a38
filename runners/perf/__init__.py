"""Hardware accounting shared by the backends: model FLOPs and bytes of a step's phases (``flops``), the
machine's ceilings (``hardware``) and the Roofline points and MFU computed from them (``roofline``).
Backend-independent: each backend hands over its batch's prompt and response lengths and phase times."""
