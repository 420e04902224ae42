"""0001's FP8 dequantisation, checked on the CPU against a full dequantisation of the cache.

Run by tests/cli/test_qsa_fp8.py with the probe venv's python, with the roots of vLLM trees (0001 applied)
as arguments; the check reads two files of each: nvidia/qsa.py and nvidia/ops/qsa.py.

What runs is the tree's own ``_dequantize_selected_fp8_blocks``, but not through an import of its
module: vllm/models/qwen4_exp/nvidia/qsa.py pulls in much of vLLM at import time, and in the probe
venv that fails (einops, compressed-tensors and a torchvision built for this torch are missing).
So the function's definition is read from the tree's file with ``ast`` and executed with torch as
its only global, after checking that it names no other module-level name. The check also reads
``forward_qsa`` to confirm the helper is wired as assumed (the whole top-k buffer as the selection,
its results replacing the cache and the block table).

The QSA Triton kernel needs CUDA and is not run. Its read rule (which selection entries it reads,
through which block-table entry, masked how) is restated here from ops/qsa.py's
``_qsa_sparse_paged_gqa_splitk_kernel``: the same on v0.29.0 and v0.30.0, except that v0.30.0's
selection buffer ends in a count column that the kernel never reads as a token.

For each random case: every entry the kernel may read must be read through the remapped table too,
with bit-identical BF16 K and V to a full FP32 dequantisation of the original cache (tokens past a
request's length whose page the table still maps included: the kernel reads them); every entry it
masks (token -1, page past the block table, block id -1 or past the end of the cache, request row
out of range) must stay masked; and the compact copy must hold only the selected blocks.

Prints one JSON line per tree, with its "exit": 0: all hold; 1: a mismatch (listed, each starting
"values:", "memory:" or "shape:"); 2: the check could not be set up (no helper in the tree, the
helper or its wiring or the kernel's layout is not what this check knows, or a masking case was
never generated). The script exits with the highest of them.
"""

from __future__ import annotations

import ast
import builtins
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

QSA = Path("vllm/models/qwen4_exp/nvidia/qsa.py")
OPS = Path("vllm/models/qwen4_exp/nvidia/ops/qsa.py")
HELPER = "_dequantize_selected_fp8_blocks"
# How forward_qsa must call the helper for this check's inputs to be the kernel's.
WIRING = ("kv_cache", "self.head_size", "layer._k_scale", "layer._v_scale", "topk_buffer[:num_tokens]",
          "attn_metadata.block_table", "token_to_req[:num_tokens]")
TRIALS = 60
SETUP_ERROR = 2


class SetupError(Exception):
    """The check could not be set up on this tree: never read as a pass or a fail."""


def give_up(message: str) -> NoReturn:
    raise SetupError(message)


def read(root: Path, path: Path) -> str:
    try:
        return (root / path).read_text()
    except OSError as exc:
        give_up(f"cannot read {path} in {root}: {exc.strerror}")


def function(module: ast.Module, name: str, where: Path) -> ast.FunctionDef:
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    give_up(f"{where}: no function {name}" + (": is 0001 applied to this tree?" if name == HELPER else ""))


def load_helper(root: Path, torch: Any) -> Any:
    """The tree's helper, executed from its own source with torch as its only global."""
    path = root / QSA
    source = read(root, QSA)
    module = ast.parse(source)
    helper = function(module, HELPER, QSA)
    bound = {a.arg for a in helper.args.args + helper.args.kwonlyargs}
    bound |= {n.id for n in ast.walk(helper) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    free = {n.id for n in ast.walk(helper) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    unknown = sorted(free - bound - set(dir(builtins)) - {"torch"})
    if unknown:
        give_up(f"{QSA}: {HELPER} uses module-level names this check does not load: {', '.join(unknown)}")
    check_wiring(source, module)
    namespace: dict[str, Any] = {"torch": torch, "__name__": "qsa_helper"}
    # Compiled under the tree's file name, with its line numbers: a traceback points into the tree.
    exec(compile(ast.Module(body=[helper], type_ignores=[]), str(path), "exec"), namespace)  # exec is the point here
    return namespace[HELPER]


def check_wiring(source: str, module: ast.Module) -> None:
    forward = function(module, "forward_qsa", QSA)
    calls = [(n.targets[0], n.value) for n in ast.walk(forward) if isinstance(n, ast.Assign)
             and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name) and n.value.func.id == HELPER]
    if len(calls) != 1:
        give_up(f"{QSA}: forward_qsa calls {HELPER} {len(calls)} times, not once")
    target, call = calls[0]
    args = tuple(ast.get_source_segment(source, a) for a in call.args)
    targets = ast.get_source_segment(source, target)
    if args != WIRING or targets != "kv_cache, block_table":
        give_up(f"{QSA}: forward_qsa calls {targets} = {HELPER}({', '.join(map(str, args))}),"
                f" not as this check assumes: {', '.join(WIRING)}")
    if "dataclasses.replace(attn_metadata, block_table=block_table)" not in (
            ast.get_source_segment(source, forward) or ""):
        give_up(f"{QSA}: forward_qsa no longer hands the remapped block table to the kernel")


def kernel_layout(root: Path) -> str:
    """'packed' when the sparse kernel's indices carry a trailing count column (v0.30.0), else 'plain'."""
    source = read(root, OPS)
    entry = function(ast.parse(source), "qsa_sparse_paged_attention", OPS)
    body = ast.get_source_segment(source, entry) or ""
    plain = "TOPK=logical_indices.shape[1]," in body
    packed = "logical_indices.shape[1] - 1" in body and "TOPK=selection_width," in body
    if plain == packed:
        give_up(f"{OPS}: qsa_sparse_paged_attention passes TOPK in a way this check does not know")
    return "packed" if packed else "plain"


def main(roots: list[Path]) -> int:
    import torch  # once for every tree: its import is most of this script's time

    worst = 0
    for root in roots:
        try:
            report, code = check_tree(torch, root)
        except SetupError as exc:
            report, code = {"error": str(exc)}, SETUP_ERROR
        print(json.dumps({"tree": str(root), "exit": code, **report}), flush=True)
        worst = max(worst, code)
    return worst


def check_tree(torch: Any, root: Path) -> tuple[dict[str, Any], int]:
    helper = load_helper(root, torch)
    layout = kernel_layout(root)
    totals: dict[str, Any] = {
        "entries_compared": 0, "entries_read": 0, "entries_read_past_sequence": 0, "blocks_in_cache": 0,
        "blocks_selected": 0, "blocks_held": 0, "blocks_held_for_count_column": 0,
        "masked": {"negative_token": 0, "page_past_table": 0, "block_id_invalid": 0, "request_out_of_range": 0},
    }
    failures: list[str] = []
    # The same seed for every tree: v0.29.0 and a broken copy of it see the same cases.
    gen = torch.Generator().manual_seed(20260906)
    for trial in range(TRIALS):
        case = random_case(torch, gen, trial, packed=layout == "packed")
        failures += check_case(torch, helper, case, totals, f"case {trial}")
    realistic = random_case(torch, gen, -1, packed=layout == "packed", realistic=True)
    real_totals = {k: (dict.fromkeys(v, 0) if isinstance(v, dict) else 0) for k, v in totals.items()}
    failures += check_case(torch, helper, realistic, real_totals, "realistic case")
    missing = [name for name, n in totals["masked"].items() if n == 0]
    if missing and not failures:
        give_up(f"the random cases never produced these masked entries: {', '.join(missing)}")
    shape = realistic["kv_cache"].shape
    block_bytes_bf16 = shape[1] * shape[2] * shape[3] * 2
    return {
        "helper": f"{QSA}:{HELPER} (its source, run with torch)", "layout": layout, "trials": TRIALS,
        **totals,
        "realistic": {
            **{k: real_totals[k] for k in ("entries_compared", "entries_read", "blocks_in_cache",
                                           "blocks_selected", "blocks_held", "blocks_held_for_count_column")},
            "compact_bytes": real_totals["blocks_held"] * block_bytes_bf16,
            "full_bf16_copy_bytes": shape[0] * block_bytes_bf16,
        },
        "failures": failures[:20], "failure_count": len(failures),
    }, 1 if failures else 0


def random_case(torch: Any, gen: Any, trial: int, *, packed: bool, realistic: bool = False) -> dict[str, Any]:
    """An e4m3 cache, a block table, token rows and a selection, with every kind of masked entry."""

    def ints(low: int, high: int, shape: tuple[int, ...] = ()) -> Any:
        return torch.randint(low, high, shape, generator=gen)

    if realistic:
        # A decode batch over a 4,096-block cache: 8 requests of 64..160 blocks, one spec-decode
        # request with 3 rows, the selection shaped as the expand kernel writes it (8 compressed
        # blocks of 64 tokens, then the causal tail, then -1).
        num_blocks, heads, block_size, head_size, width = 4096, 1, 16, 32, 160
        lengths = ints(64 * 16, 160 * 16, (8,))
        requests = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 7, 7])
        compress, block_topk = 64, 8
    else:
        num_blocks, heads = int(ints(4, 48)), int(ints(1, 3))
        block_size, head_size, width = int(16 * ints(1, 3)), int(16 * ints(1, 5)), int(ints(1, 10))
        lengths = ints(0, width * block_size + 1, (int(ints(1, 5)),))
        requests = ints(0, len(lengths), (int(ints(1, 16)),))
    num_requests = len(lengths)
    # Random bytes, minus e4m3fn's NaN codes (0x7f, 0xff), which a quantised cache never holds.
    raw = ints(0, 256, (num_blocks, heads, block_size, 2 * head_size)).to(torch.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0x7E
    # Each request's pages from a shuffled pool; past its length the table holds 0 (vLLM's null block),
    # and some entries are -1 or name a block past the end of the cache.
    pool = torch.randperm(num_blocks, generator=gen) if realistic else ints(0, num_blocks, (num_requests * width,))
    table = torch.zeros(num_requests, width, dtype=torch.long)
    for r in range(num_requests):
        pages = -(-int(lengths[r]) // block_size)
        table[r, :pages] = pool[r * width:][:pages]
    if not realistic:
        bad = torch.rand(table.shape, generator=gen)
        table[bad < 0.1] = -1
        table[(bad >= 0.1) & (bad < 0.2)] = num_blocks + ints(0, 3, table.shape)[(bad >= 0.1) & (bad < 0.2)]
    rows = len(requests)
    token_to_req = requests.clone()
    if realistic:
        selection = expand_like_the_indexer(torch, gen, lengths[requests], compress, block_topk)
    else:
        # Some rows belong to no request (-1, or a request row past the batch).
        odd = torch.rand(rows, generator=gen)
        token_to_req[odd < 0.1] = -1
        token_to_req[(odd >= 0.1) & (odd < 0.2)] = num_requests
        topk = int(ints(1, 40))
        selection = ints(0, width * block_size, (rows, topk))
        kind = torch.rand(selection.shape, generator=gen)
        selection[kind < 0.15] = -1
        selection[(kind >= 0.15) & (kind < 0.2)] = -int(ints(2, 100))
        past = (kind >= 0.2) & (kind < 0.3)
        selection[past] = width * block_size + ints(0, 3 * block_size, selection.shape)[past]
    if packed:
        topk = selection.shape[1]
        count = (selection >= 0).sum(dim=1, keepdim=True) if realistic else ints(0, topk + 1, (rows, 1))
        if not realistic and trial % 2:
            # As the expand kernel writes it: -1 past the row's count.
            selection[torch.arange(topk)[None, :] >= count] = -1
        selection = torch.cat([selection, count], dim=1)
    # vLLM's default scales are 1.0; calibrated ones are arbitrary floats (here 2^-6 .. 2^4).
    scales = torch.ones(2) if trial == 0 else torch.exp2(torch.rand(2, generator=gen) * 10 - 6)
    k_scale, v_scale = scales.float().unbind()
    return {
        "kv_cache": raw, "head_size": head_size, "k_scale": k_scale, "v_scale": v_scale,
        "selection": selection.int(), "block_table": table.int(), "token_to_req": token_to_req.int(),
        "packed": packed, "lengths": lengths,
    }


def expand_like_the_indexer(torch: Any, gen: Any, lengths: Any, compress: int, block_topk: int) -> Any:
    """Per row: block_topk compressed blocks of `compress` tokens expanded, then the causal tail, then -1."""
    width = block_topk * compress + compress - 1
    out = torch.full((len(lengths), width), -1, dtype=torch.long)
    for row, length in enumerate(lengths.tolist()):
        complete = length // compress
        chosen = torch.randperm(complete, generator=gen)[:block_topk]
        tokens = (chosen[:, None] * compress + torch.arange(compress)[None, :]).reshape(-1)
        tail = torch.arange(complete * compress, length)
        row_tokens = torch.cat([tokens, tail])[:width]
        out[row, : len(row_tokens)] = row_tokens
    return out


def reads(torch: Any, selection: Any, token_to_req: Any, table: Any, num_blocks: int,
          block_size: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    """The kernel's read rule: which (row, column) entries it reads, from which block and offset."""
    tokens = selection.long()
    requests = token_to_req.long()[:, None].expand_as(tokens)
    safe = tokens.clamp(min=0)
    pages, offsets = safe // block_size, safe % block_size
    request_ok = (requests >= 0) & (requests < table.shape[0])
    token_ok = tokens >= 0
    page_ok = pages < table.shape[1]
    ok = request_ok & token_ok & page_ok
    physical = table.long()[requests.clamp(0, table.shape[0] - 1), pages.clamp(max=table.shape[1] - 1)]
    physical = torch.where(ok, physical, -1)
    block_ok = (physical >= 0) & (physical < num_blocks)
    masked = {
        "request_out_of_range": ~request_ok, "negative_token": request_ok & ~token_ok,
        "page_past_table": request_ok & token_ok & ~page_ok, "block_id_invalid": ok & ~block_ok,
    }
    return ok & block_ok, physical, offsets, masked


def check_case(torch: Any, helper: Any, case: dict[str, Any], totals: dict[str, Any], name: str) -> list[str]:
    raw, head_size = case["kv_cache"], case["head_size"]
    num_blocks, _, block_size, _ = raw.shape
    before = raw.clone()
    compact, remapped = helper(raw, head_size, case["k_scale"], case["v_scale"], case["selection"],
                               case["block_table"], case["token_to_req"])
    problems = []
    if not torch.equal(raw, before):
        problems.append(f"shape: {name}: the helper wrote into the FP8 cache")
    if compact.dtype != torch.bfloat16 or compact.shape[1:] != raw.shape[1:]:
        problems.append(f"shape: {name}: compact cache is {compact.dtype} {tuple(compact.shape)}")
    if remapped.shape != case["block_table"].shape or remapped.dtype != case["block_table"].dtype:
        problems.append(f"shape: {name}: remapped table is {remapped.dtype} {tuple(remapped.shape)}")
    if problems:
        return problems

    # The full dequantisation the compact copy must agree with: FP32 products, rounded once to BF16.
    full = raw.view(torch.float8_e4m3fn).float()
    reference = torch.cat([full[..., :head_size] * case["k_scale"], full[..., head_size:] * case["v_scale"]],
                          dim=-1).to(torch.bfloat16)
    selection = case["selection"][:, :-1] if case["packed"] else case["selection"]
    ok, physical, offsets, masked = reads(torch, selection, case["token_to_req"], case["block_table"],
                                          num_blocks, block_size)
    ok2, physical2, _, _ = reads(torch, selection, case["token_to_req"], remapped, compact.shape[0], block_size)
    if not torch.equal(ok, ok2):
        lost = (ok & ~ok2).nonzero().tolist()[:3]
        gained = (~ok & ok2).nonzero().tolist()[:3]
        problems.append(f"values: {name}: read entries no longer read {lost}, masked entries now read {gained}")
    both = ok & ok2
    want = reference[physical[both], :, offsets[both], :]
    got = compact[physical2[both], :, offsets[both], :]
    differ = (want.view(torch.int16) != got.view(torch.int16)).any(dim=-1).any(dim=-1)
    if differ.any():
        where = both.nonzero()[differ].tolist()[:3]
        problems.append(f"values: {name}: {int(differ.sum())} read entries get other K/V than the full dequantisation,"
                        f" e.g. (row, column) {where}")

    # The memory claim: the copy holds the selected blocks and nothing else, except (v0.30.0) the block
    # the trailing count column names when read as a token, which the helper counts to stay a superset.
    selected = set(physical[ok].tolist())
    extra: set[int] = set()
    if case["packed"]:
        count_ok, count_physical, _, _ = reads(torch, case["selection"][:, -1:], case["token_to_req"],
                                               case["block_table"], num_blocks, block_size)
        extra = set(count_physical[count_ok].tolist()) - selected
    expected = max(1, len(selected | extra))
    if compact.shape[0] != expected:
        problems.append(f"memory: {name}: compact copy holds {compact.shape[0]} blocks, the selection reaches"
                        f" {len(selected)} (+{len(extra)} for the count column)")
    if not selected and not extra and bool((remapped != -1).any()):
        problems.append(f"memory: {name}: nothing selected, yet the remapped table names blocks")

    totals["entries_compared"] += selection.numel()
    totals["entries_read"] += int(ok.sum())
    # Tokens past the request's length that the table still maps (its 0 padding is vLLM's null block):
    # the kernel reads them, so the copy must carry them too.
    length = case["lengths"][case["token_to_req"].long().clamp(0, len(case["lengths"]) - 1)][:, None]
    totals["entries_read_past_sequence"] += int((ok & (selection.long() >= length)).sum())
    totals["blocks_in_cache"] += num_blocks
    totals["blocks_selected"] += len(selected)
    totals["blocks_held"] += int(compact.shape[0])
    totals["blocks_held_for_count_column"] += len(extra)
    for kind, mask in masked.items():
        totals["masked"][kind] += int(mask.sum())
    return problems


if __name__ == "__main__":
    sys.exit(main([Path(arg) for arg in sys.argv[1:]] or [Path.cwd()]))
