"""autotune: detect the hardware, plan the training knobs, launch the right engine."""

__version__ = "0.1.0"
