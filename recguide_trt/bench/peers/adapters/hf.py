"""transformers ``generate()`` on the converted ``LlamaForCausalLM`` (fp32, SDPA, left padding)."""

from __future__ import annotations

from .base import left_pad, one_at_a_time, peers_dir, threads, versions


class Transformers:
    """A static batch: every row decodes ``max_tokens`` tokens; ``attn``: ``sdpa`` or ``eager``."""

    def __init__(self, model_dir: str | None = None, attn: str = "sdpa") -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads())
        self.torch = torch
        path = model_dir or str(peers_dir() / "hf-llama")
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                          attn_implementation=attn).eval()
        # generate() merges eos_token_id=None with generation_config.json (eos 2): clear it there so
        # that None really means "never stop".
        self.model.generation_config.eos_token_id = None
        self.info = {"versions": versions("transformers", "torch")}

    def batch(self, prompts: list[list[int]], max_tokens: int, **_) -> list[list[int]]:
        from transformers import GenerationConfig

        torch = self.torch
        ids, mask, width = left_pad(prompts)
        gc = GenerationConfig(max_new_tokens=max_tokens, do_sample=False,
                              pad_token_id=0, eos_token_id=None)
        with torch.inference_mode():
            out = self.model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                                      generation_config=gc)
        return out[:, width:].tolist()

    def serial(self, prompts: list[list[int]], max_tokens: int, **knobs) -> list[list[int]]:
        return one_at_a_time(self.batch, prompts, max_tokens, **knobs)
