"""How the settings the 2025 tables do not print were attached to their rows (run once; kept to
show where each row's recompute, sequence parallelism, TP overlap, gradient-reduction dtype and
FP8 recipe came from).

Reads published_throughput_2025.yaml and megatron_bridge_llama_settings.yaml (Megatron-Bridge's
Llama perf recipes @067f987df0, each value traced to its file:line) beside it; for each row not
yet given its settings (no "settings:" entry in inferred_fields) it takes the perf recipe of the
row's model, GPU, precision and layout, or NeMo 24.07's / NeMo-Framework-Launcher's configs for
the NeMo rows, and writes the file back. A row whose run jobctl does not model (Megatron-FSDP
with CPU activation offloading, a layout no recipe has) is marked not_modelled with the reason.

Run: python3 benchmarks/data/attach_settings.py  (a second run changes nothing)
"""
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
P = HERE / 'published_throughput_2025.yaml'
text = P.read_text()
head, body = text.split('\nrows:\n', 1)
rows = yaml.safe_load('rows:\n' + body)['rows']
rec = yaml.safe_load((HERE / 'megatron_bridge_llama_settings.yaml').read_text())['recipes']
MB = '067f987df0'
PREC = {'fp8': 'fp8_cs', 'mxfp8': 'fp8_mx', 'nvfp4': 'nvfp4'}
def model_of(rid):
    return '405b' if '405b' in rid else '70b' if '70b' in rid else '8b' if '8b' in rid else None
for r in rows:
    p = r['parallel']
    tp = p['tp']
    inf = r.setdefault('inferred_fields', [])
    if any(str(x).startswith('settings: ') for x in inf):
        continue  # attached already
    if r['source'] == 'nemo_perf_summary_2407' and ('gpt3' in r['id'] or 'nemotron' in r['id']):
        # NeMo 1.0 launcher configs (the 24.07 container's GPT-3 / Nemotron-4 runs)
        gpt3 = 'gpt3' in r['id']
        p['recompute'] = 'selective' if gpt3 else 'none'
        p['sequence_parallel'] = True
        p['sharding'] = 'zero1'
        r['tp_comm_overlap'] = True
        r['fp8_recipe'] = 'delayed'
        r['grad_reduce'] = 'fp32' if gpt3 else 'bf16'
        inf.append("settings: NeMo-Framework-Launcher " + (
            "launcher_scripts/conf/training/gpt3/175b.yaml @056a90edf9 (activations_checkpoint_granularity: selective, "
            "sequence_parallel, ub_tp_comm_overlap, distributed_fused_adam with overlapped grad/param sync; its gradient "
            "reduction dtype is not set there: fp32 assumed)" if gpt3 else
            "launcher_scripts/conf/training/nemotron/nemotron_340b.yaml @3be81fc10d (no activation checkpointing, "
            "sequence_parallel, ub_tp_comm_overlap, mcore_distributed_optim with grad_sync_dtype bf16)")
            + "; FP8 with delayed scaling (the launcher's fp8_amax_history_len 1024, Transformer Engine's only FP8 recipe "
            "in 2024); the launcher versions read are not pinned to the 24.07 release")
        continue
    if r['source'] == 'nemo_perf_summary_2407':
        p['recompute'] = 'none'
        p['sequence_parallel'] = tp > 1
        p['sharding'] = 'zero1'
        r['tp_comm_overlap'] = tp > 1
        r['grad_reduce'] = 'fp32'
        r['fp8_recipe'] = 'delayed'
        inf.append("settings: NeMo 24.07's performance recipes (nemo/collections/llm/recipes/llama3_70b.py "
                   "pretrain_recipe_performance @8e3d65dcfe: tp_comm_overlap=True; trainer(): sequence_parallel when tp > 1, no "
                   "recompute set), the distributed optimizer, fp32 gradient reduction (recipes/precision/mixed_precision.py "
                   "bf16_mixed: grad_reduce_in_fp32=True); FP8 with delayed scaling, Transformer Engine's only FP8 recipe in 2024")
        continue
    key = (model_of(r['id']), r['gpu'].split('-')[0], PREC[r['precision']])
    cands = [e for e in rec if (e['model'], e['gpu'], e['precision']) == key]

    def lay(e):
        return (e['tp'], e['pp'], e['cp'], e['vp'] or 1, e['micro_batch'])
    mine = (tp, p['pp'], p['cp'], p['vp'] or 1, p['micro_batch'])
    same = [e for e in cands if lay(e) == mine]
    same.sort(key=lambda e: e['gpus'] != r['gpus'])
    fsdp_row = p['sharding'] == 'fsdp'
    if not same:
        why = f"no Megatron-Bridge perf recipe @{MB} for {key} has this layout (tp/pp/cp/vp/mbs {mine}; " + \
              (f"the recipes have {sorted({lay(e) for e in cands})}" if cands else "none for this model, GPU and precision") + ")"
        r['not_modelled'] = why
        inf.append('settings: ' + why)
        continue
    e = same[0]
    fs = e['fsdp'] or {}
    if fsdp_row and not fs.get('use_megatron_fsdp'):
        r['not_modelled'] = (f"the run used Megatron-FSDP; the perf recipe of its layout @{MB} ({e['function']}) does not, "
                             "so the release's recompute and offload settings are unknown")
        inf.append('settings: ' + r['not_modelled'])
        continue
    if fsdp_row or fs.get('use_megatron_fsdp'):
        o = e.get('other') or {}
        r['not_modelled'] = (f"Megatron-FSDP with CPU activation offloading of {o.get('cpu_offloading_num_layers')} layers "
                             f"({e['function']} @{MB}: use_megatron_fsdp, cpu_offloading), which jobctl does not model")
        inf.append('settings: ' + r['not_modelled'])
        continue
    rc = e['recompute']
    if rc == 'none' or not rc:
        p['recompute'] = 'none'
    else:
        assert rc['granularity'] == 'full' and rc['method'] == 'block', rc
        p['recompute'] = 'full'
        p['recompute_layers'] = rc['num_layers']
    p['sequence_parallel'] = tp > 1
    p['sharding'] = 'zero1'
    r['tp_comm_overlap'] = bool(e['tp_comm_overlap']['tp_comm_overlap']) and tp > 1
    r['grad_reduce'] = 'bf16'
    if r['precision'] == 'fp8' and r.get('fp8_recipe') is None:
        r['fp8_recipe'] = 'tensorwise'
    inf.append(f"settings: Megatron-Bridge perf recipe {e['function']} ({e['file']} @{MB}; same tp/pp/cp/vp/mbs"
               f"{'' if e['gpus'] == r['gpus'] else ', other GPU count ' + str(e['gpus'])}{', other global batch ' + str(e['global_batch']) if e['global_batch'] != p['global_batch'] else ''}): "
               f"recompute {p['recompute']}{' of ' + str(p.get('recompute_layers')) + ' layers (block)' if p.get('recompute_layers') else ''}, "
               f"sequence parallel {'on' if tp > 1 else 'off'}, TP comm overlap {'on' if r['tp_comm_overlap'] else 'off'}, "
               "distributed optimizer, grad_reduce_in_fp32=False"
               + (", fp8 recipe fp8_cs (current scaling = tensorwise)" if r['precision'] == 'fp8' else "")
               + "; the release's own recipe may have differed")
out = head + '\nrows:\n' + yaml.safe_dump(rows, sort_keys=False, width=150, allow_unicode=True)
if out != text:
    P.write_text(out)
for r in rows:
    print(r['id'][:44].ljust(44), r.get('not_modelled', '')[:60] or r['parallel'].get('recompute'), r.get('tp_comm_overlap'))
