"""kjit.integrations: kjit inside other libraries' model code.

transformers: kjit as an experts implementation of Hugging Face transformers
(>= 5): register(), enable(model), disable(model), add_lora(model, ...)
(kjit/integrations/transformers.py; docs/transformers.md). Imported on
demand: `import kjit.integrations.transformers` needs torch and transformers,
this package needs neither.
"""

__all__ = ["transformers"]
