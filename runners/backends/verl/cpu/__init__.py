"""The verl backend's CPU mode: verl's trainer on this machine's CPU, one training process.

``mode`` decides when a cell runs in CPU mode and rewrites the translation for it; ``platform`` is
verl's device platform for the CPU, ``hf_rollout`` / ``hf_server`` the Hugging Face sampler that stands
in for vLLM, ``driver_entry`` verl's main with its TaskRunner in the driver process, ``model_export`` the
project's models written as Hugging Face directories. This ``__init__`` imports nothing.
"""
