"""transformers ``generate()`` on the converted ``LlamaForCausalLM`` (fp32, SDPA, left padding)."""

from __future__ import annotations

from .base import left_pad, models_dir, one_at_a_time, special_ids, threads, versions


class Transformers:
    """A static batch: every row decodes ``max_tokens`` tokens; ``attn``: ``sdpa`` or ``eager``;
    ``precision="default"``: ``dtype="auto"`` (the checkpoint's bf16)."""

    def __init__(self, model_dir: str | None = None, attn: str = "sdpa", precision: str = "float32") -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads())
        self.torch = torch
        path = model_dir or str(models_dir() / "hf-llama")
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype="auto" if precision == "default" else torch.float32,
                                                          attn_implementation=attn).eval()
        # generate() merges eos_token_id=None with generation_config.json (eos): clear it there so
        # that None really means "never stop".
        self.model.generation_config.eos_token_id = None
        self.pad = special_ids()["pad"]
        self.info = {"versions": versions("transformers", "torch")}

    def batch(self, prompts: list[list[int]], max_tokens: int, **_) -> list[list[int]]:
        from transformers import GenerationConfig

        torch = self.torch
        ids, mask, width = left_pad(prompts, self.pad)
        gc = GenerationConfig(max_new_tokens=max_tokens, do_sample=False,
                              pad_token_id=self.pad, eos_token_id=None)
        with torch.inference_mode():
            out = self.model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                                      generation_config=gc)
        return out[:, width:].tolist()

    def serial(self, prompts: list[list[int]], max_tokens: int, **knobs) -> list[list[int]]:
        return one_at_a_time(self.batch, prompts, max_tokens, **knobs)
