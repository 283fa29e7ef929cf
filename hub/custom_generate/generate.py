"""Token Recycling (Luo et al., ACL 2025) as a Hub `custom_generate` recipe.

    model.generate(**inputs, custom_generate="<you>/token-recycling", trust_remote_code=True, template="hybrid")

transformers hands this function the arguments of `generate`; it calls `generate` again with Token Recycling's
decoding loop (`tr_core.hf.generate`, from the `token-recycling` package) in place of the standard one, so the
generation config, logits processors, stopping criteria and streamers are prepared exactly as usual.
"""
import tr_core.hf


def generate(model, **generate_arguments):
    """Run `model.generate` with Token Recycling's decoding loop."""
    return model.generate(custom_generate=tr_core.hf.generate, **generate_arguments)
