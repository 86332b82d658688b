"""Linear-attention and Mamba layers: the state one request keeps per layer, and the layers' parameters.

Hybrid models mix attention layers (a KV cache that grows with the tokens) with layers whose state has a fixed
size per request: Gated DeltaNet (Qwen3-Next, Qwen3.5), Mamba2 (Nemotron-H, Granite 4, Bamba) and Mamba1 (Jamba).
vLLM keeps each such layer's state in one block of the shared pool, and makes every page the same size
(HybridAttentionMambaModelConfig.verify_and_update_config): the attention block size grows to the smallest multiple
of 16 tokens whose page holds a layer's state, and the state's page is padded up to the attention page::

    attention block = 16 x ceil(state bytes / (16 x attention bytes per token))
    state page      = attention block x attention bytes per token

The state's shapes per GPU follow vLLM's MambaStateShapeCalculator (model_executor/layers/mamba/mamba_utils.py):

    Gated DeltaNet  conv  (2 x k_heads x k_dim + v_heads x v_dim) / TP x (kernel - 1)
                    ssm   v_heads / TP x k_dim x v_dim
    Mamba2          conv  (intermediate + 2 x groups x state) / TP x (kernel - 1)   (groups replicated up to TP)
                    ssm   heads / TP x head_dim x state
    Mamba1          conv  intermediate / TP x (kernel - 1);  ssm  intermediate / TP x state

in the model's dtype, the SSM state in ``mamba_ssm_dtype`` where config.json names one (Qwen3.5: float32; vLLM's
mamba_ssm_cache_dtype 'auto' follows it).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.errors import KvlabError

LINEAR_ATTENTION = "linear_attention"  # Gated DeltaNet
MAMBA = "mamba"
NO_CACHE = "mlp_only"  # Nemotron-H's '-' blocks: an MLP, no attention, no state
# The multiple of tokens vLLM aligns a hybrid model's attention block to (the attention kernels' block alignment).
KERNEL_BLOCK_ALIGNMENT = 16


@dataclass(frozen=True)
class StateLayout:
    """One linear-attention or Mamba layer's numbers, as config.json gives them."""

    kind: str  # "gdn" | "mamba2" | "mamba1"
    conv_kernel: int
    num_heads: int  # GDN: value heads; Mamba2: heads; Mamba1: unused (0)
    head_dim: int  # GDN: value head dim; Mamba2: head dim
    state_size: int  # GDN: key head dim; Mamba: d_state
    num_k_heads: int = 0  # GDN
    n_groups: int = 1  # Mamba2
    intermediate_size: int = 0  # Mamba1/2
    ssm_dtype_bytes: int | None = None  # config.json's mamba_ssm_dtype (Qwen3.5: float32); None: the model's dtype

    def conv_elements(self, tp: int, num_spec: int = 0) -> int:
        """The convolution state's elements on one GPU; with speculative decoding Gated DeltaNet and Mamba2 keep
        ``num_spec`` more rows (MambaStateShapeCalculator's num_spec: kernel - 1 + num_spec), Mamba1 none."""
        if self.kind == "gdn":
            conv_dim = 2 * self.num_k_heads * self.state_size + self.num_heads * self.head_dim
        elif self.kind == "mamba2":
            groups = self.n_groups if self.n_groups % tp == 0 else tp  # extra_groups_for_head_shards
            conv_dim = self.intermediate_size + 2 * groups * self.state_size
        else:
            conv_dim, num_spec = self.intermediate_size, 0
        return conv_dim // tp * (self.conv_kernel - 1 + num_spec)

    def ssm_elements(self, tp: int) -> int:
        if self.kind == "gdn":
            return self.num_heads // tp * self.state_size * self.head_dim
        if self.kind == "mamba2":
            return self.num_heads // tp * self.head_dim * self.state_size
        return self.intermediate_size // tp * self.state_size

    def state_bytes(self, tp: int, dtype_bytes: int, num_spec: int = 0) -> int:
        """One request's state in one layer on one GPU (MambaSpec.page_size_bytes before padding): the convolution
        state in the model's dtype, the SSM state in mamba_ssm_dtype where the config sets one; ``num_spec``: the
        speculative tokens of a speculative config (0 without)."""
        return (self.conv_elements(tp, num_spec) * dtype_bytes
                + self.ssm_elements(tp) * (self.ssm_dtype_bytes or dtype_bytes))

    @property
    def prefix_caching_mode(self) -> str:
        """vLLM's mamba_cache_mode when prefix caching is turned on before 0.28.0 (models/config.py MambaModelConfig;
        from 0.28.0 'align' for every hybrid: kvlab.vllm_rules.mamba_cache_mode): 'all' for the
        models that support Mamba prefix caching (the Mamba1/Mamba2 families: Jamba, Mamba, Nemotron-H, Granite 4,
        Zamba2, Falcon-H1), 'align' for the others (Gated DeltaNet: Qwen3-Next, Qwen3.5)."""
        return "align" if self.kind == "gdn" else "all"

    def params(self, hidden_size: int) -> int:
        """Parameters of one such layer's mixer (projections, convolution, per-head scalars, norm)."""
        h = hidden_size
        if self.kind == "gdn":
            key, value = self.num_k_heads * self.state_size, self.num_heads * self.head_dim
            conv_dim = 2 * key + value
            return (h * (2 * key + 2 * value) + h * 2 * self.num_heads + conv_dim * self.conv_kernel
                    + 2 * self.num_heads + self.head_dim + value * h)
        if self.kind == "mamba2":
            inner = self.intermediate_size
            conv_dim = inner + 2 * self.n_groups * self.state_size
            return (h * (2 * inner + 2 * self.n_groups * self.state_size + self.num_heads)
                    + conv_dim * (self.conv_kernel + 1) + 3 * self.num_heads + inner + inner * h)
        inner = self.intermediate_size
        dt_rank = -(-h // 16)
        return (h * 2 * inner + inner * (self.conv_kernel + 1) + inner * (dt_rank + 2 * self.state_size)
                + dt_rank * inner + inner + inner * self.state_size + inner + inner * h)


def attention_block_size(state_page_bytes: int, attention_bytes_per_token: int, block_size: int) -> int:
    """The attention block size vLLM settles on for a hybrid model: the given one if its page already holds a
    layer's state, else the smallest multiple of 16 tokens whose page does."""
    needed = KERNEL_BLOCK_ALIGNMENT * -(-state_page_bytes // (KERNEL_BLOCK_ALIGNMENT * attention_bytes_per_token))
    return max(block_size, needed)


SSM_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def state_layout(fields: dict, model_type: str, where: str) -> StateLayout | None:
    """The linear-attention or Mamba layout a config.json describes, or None for a model without one."""
    from dataclasses import replace

    layout = _state_layout(fields, model_type, where)
    ssm = fields.get("mamba_ssm_dtype")
    if layout is None or ssm is None:
        return layout
    if str(ssm) not in SSM_DTYPE_BYTES:
        raise KvlabError(f"{where}: mamba_ssm_dtype {ssm!r} is not one of {', '.join(SSM_DTYPE_BYTES)}")
    return replace(layout, ssm_dtype_bytes=SSM_DTYPE_BYTES[str(ssm)])


def _state_layout(fields: dict, model_type: str, where: str) -> StateLayout | None:
    if fields.get("linear_num_value_heads") is not None:
        return StateLayout("gdn", conv_kernel=int(fields.get("linear_conv_kernel_dim", 4)),
                           num_heads=int(fields["linear_num_value_heads"]),
                           head_dim=int(fields.get("linear_value_head_dim", 128)),
                           state_size=int(fields.get("linear_key_head_dim", 128)),
                           num_k_heads=int(fields.get("linear_num_key_heads", fields["linear_num_value_heads"])))
    hidden = int(fields.get("hidden_size") or 0)
    if fields.get("mamba_num_heads") is not None or fields.get("mamba_n_heads") is not None:  # Nemotron-H, Granite 4
        heads = int(fields.get("mamba_num_heads") or fields.get("mamba_n_heads") or 0)
        head_dim = int(fields.get("mamba_head_dim") or fields.get("mamba_d_head") or 64)
        return StateLayout("mamba2", conv_kernel=int(fields.get("conv_kernel") or fields.get("mamba_d_conv") or 4),
                           num_heads=heads, head_dim=head_dim,
                           state_size=int(fields.get("ssm_state_size") or fields.get("mamba_d_state") or 128),
                           n_groups=int(fields.get("n_groups") or fields.get("mamba_n_groups") or 1),
                           intermediate_size=heads * head_dim)
    if fields.get("mamba_d_state") is not None and model_type in ("jamba",):
        return StateLayout("mamba1", conv_kernel=int(fields.get("mamba_d_conv", 4)), num_heads=0, head_dim=0,
                           state_size=int(fields["mamba_d_state"]),
                           intermediate_size=int(fields.get("mamba_expand", 2)) * hidden)
    if any(t in (LINEAR_ATTENTION, MAMBA) for t in (fields.get("layer_types") or [])):
        raise KvlabError(f"{where}: layer_types names linear-attention or Mamba layers but the config gives no state "
                         "sizes kvlab knows (linear_num_value_heads, mamba_num_heads / mamba_n_heads, mamba_d_state)")
    return None


def hybrid_layer_types(fields: dict, model_type: str, num_layers: int) -> tuple[str, ...] | None:
    """Each layer's kind for a hybrid model whose config does not list ``layer_types``; None if not hybrid."""
    if fields.get("full_attention_interval"):  # Qwen3-Next: every n-th layer is full attention
        n = int(fields["full_attention_interval"])
        return tuple("full_attention" if (i + 1) % n == 0 else LINEAR_ATTENTION for i in range(num_layers))
    pattern = fields.get("hybrid_override_pattern")  # Nemotron-H: M mamba, * attention, - MLP, E MoE
    if pattern:
        kinds = {"M": MAMBA, "*": "full_attention", "-": NO_CACHE, "E": NO_CACHE}
        return tuple(kinds.get(c, NO_CACHE) for c in pattern[:num_layers])
    if model_type == "jamba" and fields.get("attn_layer_period"):
        period, offset = int(fields["attn_layer_period"]), int(fields.get("attn_layer_offset", 0))
        return tuple("full_attention" if i % period == offset else MAMBA for i in range(num_layers))
    return None
