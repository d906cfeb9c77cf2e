"""Several devices, one program: a ("dp", "tp") mesh, a tensor-parallel target, a data-parallel batch.

The decode program stays decode.generate_program, jitted once; only its inputs are placed with
NamedShardings and GSPMD propagates them through the loop.
- target, Megatron-style over "tp": wqkv (+ bqkv) split by KV head, each shard holding whole KV heads
  with their queries, and w_gu by MLP unit; wo and w_down split by input row, so each layer costs one
  all-reduce after attention and one after the MLP. rot_k split by KV head. lm_head split by
  vocabulary when tp divides it; embedding and norms replicated.
- draft model or EAGLE-3 head: replicated. It is small, and every tp shard runs it for its own dp rows.
- caches [B, Hkv, X, ...] (BF16 rows, INT2 codes, scales, zeros alike): rows over "dp", KV heads over
  "tp" for the target; the draft cache over "dp" only. Lengths and every other [B, ...] input over "dp".
The batch must divide by dp: the engine pads it with dummy rows (buckets.pad_rows).

The Pallas INT2 kernel is a custom call that GSPMD cannot split: attention_split.per_shard wraps the
split attention in shard_map so that each device runs it on its own (dp, tp) block of rows and KV
heads; the Engine lowers its program under the mesh (context) so that per_shard finds it.
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from jspec.cache.kvcache import KVCache
from jspec.config import DP, TP, ConfigError, ModelConfig
from jspec.decode.state import ProgramArgs
from jspec.model.decoder import Layer, Params

# Layer fields split over tp (the rest are replicated): the projections into heads by KV head and
# into the MLP by unit, the projections out of them by row. wqkv's KV-head axis carries each head's
# q, k and v together; wo's head-major rows [Hq*D] split into blocks of whole query heads, the same
# heads (h*g..) as the wqkv block of KV head h.
_LAYER_SPECS = dict(
    wqkv=P(None, TP, None, None), bqkv=P(TP, None, None), wo=P(TP, None),
    w_gu=P(None, None, TP), b_gu=P(None, TP), w_down=P(TP, None), rot_k=P(TP, None, None),
    key_noise=P(TP),
)


def parse_mesh(spec: str | None, n_devices: int) -> tuple[int, int]:
    """'tp=N,dp=M' -> (dp, tp). An omitted axis takes the devices left; None: all data-parallel."""
    sizes = {}
    for part in (spec or "").replace(" ", "").split(","):
        if not part:
            continue
        name, _, value = part.partition("=")
        if name not in (DP, TP) or name in sizes or not value.isdigit() or int(value) < 1:
            raise ConfigError(f"bad mesh {spec!r}: expected 'tp=N,dp=M' with positive integers")
        sizes[name] = int(value)
    for name, other in ((DP, TP), (TP, DP)):
        if name not in sizes:
            if n_devices % sizes.get(other, 1):
                raise ConfigError(f"mesh {spec!r}: {other}={sizes[other]} does not divide {n_devices} devices")
            sizes[name] = n_devices // sizes.get(other, 1)
    if sizes[DP] * sizes[TP] != n_devices:
        raise ConfigError(f"mesh {spec!r}: tp * dp = {sizes[TP] * sizes[DP]} but there are {n_devices} devices "
                          "(hide devices with CUDA_VISIBLE_DEVICES to use fewer)")
    return sizes[DP], sizes[TP]


def make_mesh(spec: str | None = None, cfg: ModelConfig | None = None, devices=None) -> Mesh:
    """A ("dp", "tp") mesh over `devices` (default: every local device), checked against cfg if given."""
    devices = list(devices if devices is not None else jax.local_devices())
    dp, tp = parse_mesh(spec, len(devices))
    # Auto axes: GSPMD propagates the input shardings through the program (Explicit, the default of
    # jax.make_mesh, would make every sharded op in the model spell out its output sharding).
    mesh = jax.make_mesh((dp, tp), (DP, TP), (AxisType.Auto, AxisType.Auto), devices=devices)
    if cfg is not None:
        check_mesh(mesh, cfg)
    return mesh


def check_mesh(mesh: Mesh, cfg: ModelConfig) -> None:
    """tp must split heads and MLP units evenly: a shard holds whole KV heads with all their queries."""
    tp = mesh.shape[TP]
    for what, n in (("KV heads", cfg.num_kv_heads), ("query heads", cfg.num_heads),
                    ("intermediate size", cfg.intermediate_size)):
        if n % tp:
            raise ConfigError(f"tp={tp} does not divide the target's {what} ({n})")


def _put(x, mesh: Mesh, spec: P):
    return None if x is None else jax.device_put(x, NamedSharding(mesh, spec))


def replicate(tree, mesh: Mesh):
    """Every leaf whole on every device."""
    return jax.tree.map(lambda x: _put(x, mesh, P()), tree)


def param_specs(params: Params, mesh: Mesh) -> Params:
    """The PartitionSpec of every target weight (a Params of specs; None where the weight is None). The layer
    stacks keep their layer axis whole on every device."""
    spec = lambda f: None if getattr(params.layers, f.name) is None else P(None, *_LAYER_SPECS.get(f.name, P()))
    layers = Layer(**{f.name: spec(f) for f in dataclasses.fields(Layer)})
    head = params.lm_head
    vocab_split = head is not None and head.shape[1] % mesh.shape[TP] == 0
    head_spec = None if head is None else (P(None, TP) if vocab_split else P())
    return Params(P(), layers, P(), head_spec)


def shard_params(params: Params, cfg: ModelConfig, mesh: Mesh) -> Params:
    """The target, tensor-parallel over "tp" and replicated over "dp"."""
    check_mesh(mesh, cfg)
    specs = param_specs(params, mesh)
    return jax.tree.map(lambda x, s: _put(x, mesh, s), params, specs, is_leaf=lambda x: isinstance(x, P))


def shard_cache(cache: KVCache, mesh: Mesh, heads: bool = True) -> KVCache:
    """Every [L, B, Hkv, X, ...] cache array by row over "dp" and (heads=True) by KV head over "tp", the layer
    axis whole."""
    spec = P(None, DP, *(TP,) * heads)
    layers = jax.tree.map(lambda x: _put(x, mesh, spec), cache.layers)
    return cache.replace(layers=layers, length=_put(cache.length, mesh, P(DP)))


def shard_batch(tree, mesh: Mesh):
    """Every [B, ...] leaf by row over "dp"."""
    return jax.tree.map(lambda x: _put(x, mesh, P(DP)), tree)


def shard_program_args(mesh: Mesh, args: ProgramArgs) -> ProgramArgs:
    """decode.generate_program's arguments placed on the mesh."""
    m = args.models
    m = m.replace(target=shard_params(m.target, m.target_cfg, mesh), drafter=replicate(m.drafter, mesh))
    prompts, prompt_lens, max_new, sampler, seeds = shard_batch(
        (args.prompts, args.prompt_lens, args.max_new, args.sampler, args.seeds), mesh)
    draft_cache = None if args.draft_cache is None else shard_cache(args.draft_cache, mesh, heads=False)
    return ProgramArgs(m, prompts, prompt_lens, max_new, sampler, seeds, shard_cache(args.cache, mesh),
                       draft_cache, replicate(args.eos_ids, mesh),
                       None if args.stops is None else shard_stops(mesh, args.stops),
                       None if args.allowed is None else shard_batch(args.allowed, mesh))


def shard_stops(mesh: Mesh, stops):
    """jspec.stops.Stops on the mesh: the token tables whole on every device, the rows' stop strings by row."""
    return stops.replace(**replicate(dict(table=stops.table, lens=stops.lens, lead=stops.lead), mesh),
                         **shard_batch(dict(strings=stops.strings, sizes=stops.sizes), mesh))


def dp_size(mesh: Mesh | None) -> int:
    """Rows per batch must be a multiple of this (1 without a mesh)."""
    return 1 if mesh is None else mesh.shape[DP]


def context(mesh: Mesh | None):
    """The mesh as the tracing context (jax.set_mesh) while a program is lowered; nothing without one."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


def resolve_mesh(mesh: str | Mesh | None, cfg: ModelConfig) -> Mesh | None:
    """jspec.load's mesh argument: a Mesh, a 'tp=N,dp=M' spec, "auto" (every local device data-parallel
    when there are several, else none) or None/"none" (one device, no mesh)."""
    if mesh == "auto":
        return make_mesh(None, cfg) if jax.local_device_count() > 1 else None
    if mesh is None or mesh == "none":
        return None
    if isinstance(mesh, str):
        return make_mesh(mesh, cfg)
    if tuple(mesh.axis_names) != (DP, TP) or any(t != AxisType.Auto for t in mesh.axis_types):
        raise ConfigError(f"the mesh must have Auto axes ('dp', 'tp') (see jspec.runtime.sharding.make_mesh), got {mesh}")
    check_mesh(mesh, cfg)
    return mesh
