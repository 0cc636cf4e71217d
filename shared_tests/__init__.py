"""The shared suite (``pytest shared_tests``); conftest.py says how it runs."""

# XLA's cheaper code generation, which conftest.py sets for every process of a test run: LLVM's light
# passes and the older elemental emitters (the HLO passes, so the programs' math, are XLA's usual ones).
LIGHT_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true",
                   "--xla_cpu_use_fusion_emitters=false")  # fmt: skip
