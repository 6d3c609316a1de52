// The run file's schema as one table (declared in trainscope/io/schema.hpp): every group,
// dataset, series column, table column, compound field and attribute the application writes, in
// the order of docs/run_file_schema.md. RunFile checks every object it writes against it; the
// reference tables of docs/run_file_schema.md and postprocess/trainscope_post/schema.py are
// generated from it (scripts/gen_schema), so each `meaning` is Markdown, one paragraph, without
// table separators. This file: the run's description and its series (/, /config, /build, /plan,
// /ranks, /iterations, /epochs); schema_table_results.cpp: what the run measured at its end and
// on the side (/summary, /comm, /telemetry, /profile).
#include "schema_table.hpp"

namespace trainscope::io::schema {
namespace {

// Entry: kind, path (a schema.hpp constant; for attribute/column/field the object they are of),
// name, units, type, when, meaning.
const std::vector<Entry>& run_entries() {
    static const std::vector<Entry> t = {
        {Kind::group, kRoot, "", "", "", "",
         "The file's root group. Every trainscope job writes one HDF5 file (`output.file`, "
         "default `trainscope_run.h5`); all ranks create and write it together through parallel "
         "HDF5 (MPI-IO driver, collective metadata operations; per-rank series rows are "
         "written by each rank with independent I/O, the other datasets with collective "
         "writes). "
         "Attributes, here and on every group, are written collectively with rank 0's values: "
         "strings are variable-length UTF-8 (h5py returns `str`), integers int64, reals float64; "
         "times are UTC in ISO 8601 with a `Z` suffix, e.g. `2025-01-31T12:34:56Z`. Groups and "
         "attributes not listed here may be added by later versions of the application under the "
         "same schema."},
        {Kind::attribute, kRoot, "schema", "", "str", "",
         "The schema version, `trainscope/1`. Readers must check it: a change that renames, "
         "removes or reinterprets anything gets a new version (`trainscope/2`); adding groups, "
         "datasets, attributes or columns does not, so readers should ignore what they do not "
         "know."},
        {Kind::attribute, kRoot, "status", "", "str", "",
         "`running`, `completed`, `failed` or `interrupted`; a run is finished only if `status` "
         "is `completed` (the file then holds everything, including `/summary` and "
         "`finished_utc`). `failed`: all ranks caught an error together and recorded it "
         "(`error`); the file holds the rows up to the failure. `interrupted`: SIGTERM, SIGUSR1 "
         "or SIGINT stopped it at an iteration boundary (all ranks agreed on the same one), after "
         "a checkpoint when `checkpoint.dir` is set; the file holds the rows up to the stop and "
         "the `/summary` of those. `running`: the job is still going, or it died without closing "
         "the file (killed by the batch system, node failure, `MPI_Abort` after a one-rank "
         "error): a `running` file whose job is no longer alive is an interrupted run whose rows "
         "up to its last sync are valid (`output.sync_every_s`: at most that old), later ones "
         "lost, and which has no `/summary`. A job killed between syncs can leave a file HDF5 "
         "cannot open (HDF5 1.10 has no journaling for parallel files); "
         "`output.sync_every_s=0` syncs at every flush and narrows that window to the few "
         "milliseconds of a flush."},
        {Kind::attribute, kRoot, "created_utc", "", "str", "",
         "When the file was created (rank 0's clock)."},
        {Kind::attribute, kRoot, "flushed_utc", "", "str", "",
         "The last sync of the file to disk (rank 0's clock): the file holds every row recorded "
         "before it. Ranks buffer rows in memory and write them in a collective flush every "
         "`output.flush_every` iterations and when the run ends (also when it ends with an error "
         "all ranks agreed on): rank 0 the aggregates at every flush, each rank that keeps "
         "per-rank rows its own with independent I/O once 512 are pending and at every sync. "
         "HDF5's metadata reaches the disk (an fsync on every rank) at a flush when "
         "`output.sync_every_s` "
         "seconds have passed since the last sync (0: at every flush) and "
         "at every status change, so a killed job's file holds the rows of its last sync: at "
         "most `output.sync_every_s` old."},
        {Kind::attribute, kRoot, "finished_utc", "", "str", "status is not running",
         "When a final status (`completed`, `failed` or `interrupted`) was written; absent while "
         "`running`."},
        {Kind::attribute, kRoot, "world_size", "", "int", "",
         "Number of ranks = the first dimension of every per-rank dataset, and of every per-rank "
         "series unless `per_rank` kept fewer."},
        {Kind::attribute, kRoot, "per_rank", "", "str", "",
         "`output.per_rank` as resolved: which ranks write per-rank series rows (`all`, `none`, "
         "`node`, `every:K`); the series' `ranks` datasets list them (issue 39)."},
        {Kind::attribute, kRoot, "trainscope_version", "", "str", "",
         "Version of trainscope that wrote the file (the same as `/build@trainscope`)."},
        {Kind::attribute, kRoot, "git_sha", "", "str", "",
         "Git commit trainscope was built from (the same as `/build@git_sha`)."},
        {Kind::attribute, kRoot, "command_line", "", "str", "",
         "The command line the job was started with."},
        {Kind::attribute, kRoot, "num_nodes", "", "int", "",
         "Number of nodes the ranks run on (`/ranks` field `node` is 0 .. num_nodes-1)."},
        {Kind::attribute, kRoot, "workload", "", "str", "",
         "`run.workload`: `cv`, `llm` or `comm`."},
        {Kind::attribute, kRoot, "error", "", "str", "status=failed",
         "The error message, when the run ended `failed`."},
        {Kind::attribute, kRoot, "restart_index", "", "int", "--resume",
         "Only in a file written by `--resume`: k for the k-th continuation of a run. `--resume` "
         "continues from the newest complete checkpoint in `checkpoint.dir`; when the interrupted "
         "run's file is still at `output.file`, the continuation is written to "
         "`<stem>.resume<k>.h5` beside it (k = 1, 2, …): one file per segment."},
        {Kind::attribute, kRoot, "resumed_from_checkpoint", "", "str", "--resume",
         "Only with `--resume`: the checkpoint directory this segment continued from."},
        {Kind::attribute, kRoot, "resumed_from_iteration", "", "int", "--resume",
         "Only with `--resume`: the first iteration this file holds (its `/iterations/iteration` "
         "column holds global iteration numbers). A whole run is the concatenation of its "
         "segments' rows along the iteration axis, each segment cut at the next one's "
         "`resumed_from_iteration` (a segment that crashed after its last checkpoint recorded a "
         "few iterations the next one repeats). An epoch interrupted in the middle is recorded in "
         "`/epochs` only by the segment that finishes it, with `train_loss` over that segment's "
         "part of the epoch."},
        {Kind::attribute, kRoot, "resumed_from_file", "", "str", "--resume",
         "Only with `--resume`: the run file of the segment that wrote the checkpoint (its "
         "predecessor)."},
        {Kind::attribute, kRoot, "resumed_from_world_size", "", "int", "--resume",
         "Only with `--resume`: the rank count of the segment that wrote the checkpoint; differs "
         "from `world_size` after an elastic resume (added in issue 27)."},
        {Kind::attribute, kRoot, "continued_in", "", "str", "continued by --resume",
         "Set on an interrupted run's file when `--resume` continued it in another file: the path "
         "of that file. The interrupted file is otherwise never rewritten."},
        {Kind::group, kConfig, "", "", "", "",
         "The resolved configuration: one attribute per option, named `section.key` (e.g. "
         "`train.lr`), and the dataset `ini`."},
        {Kind::attribute, kConfig, "{option}", "", "str", "",
         "The resolved value of option `{option}` (`section.key`, e.g. `train.lr`) as text, for "
         "every option the run declared, defaults and workload defaults included (see "
         "[options.md](options.md))."},
        {Kind::text, kConfigIni, "", "text", "", "",
         "The resolved configuration as an INI file (rerunnable with `--config`): one `[section]` "
         "block per section. A scalar fixed-length UTF-8 string padded with NULs: h5py returns "
         "`bytes` from `ds[()]`; use `ds.asstr()[()]` for `str`."},
        {Kind::group, kBuild, "", "", "", "",
         "Versions of everything trainscope was built with (what `trainscope --version` prints) "
         "and the MPI library found at run time; every attribute is a string."},
        {Kind::attribute, kBuild, "trainscope", "", "str", "", "trainscope's version."},
        {Kind::attribute, kBuild, "git_sha", "", "str", "", "Git commit of the build."},
        {Kind::attribute, kBuild, "compiler", "", "str", "", "C++ compiler id and version."},
        {Kind::attribute, kBuild, "build_type", "", "str", "", "CMake build type, e.g. `Release`."},
        {Kind::attribute, kBuild, "libtorch", "", "str", "", "LibTorch version."},
        {Kind::attribute, kBuild, "cuda", "", "str", "",
         "CUDA version, `none` when built without CUDA."},
        {Kind::attribute, kBuild, "nccl", "", "str", "",
         "NCCL version, `none` when built without NCCL."},
        {Kind::attribute, kBuild, "mpi", "", "str", "",
         "MPI standard version the build was configured with, e.g. `MPI 3.1`."},
        {Kind::attribute, kBuild, "hdf5", "", "str", "", "HDF5 version."},
        {Kind::attribute, kBuild, "features", "", "str", "",
         "Enabled features, comma-separated: `parallel-hdf5`, plus `cuda` and `nccl` when built "
         "with them."},
        {Kind::attribute, kBuild, "mpi_library", "", "str", "",
         "The MPI library the job runs with (first line of `MPI_Get_library_version`)."},
        {Kind::group, kPlan, "", "", "", "",
         "The run's plan (batch split, iterations, parameters, memory estimate), written when the "
         "run starts, after the data and model are built. The CV workload writes `strategy`, "
         "`precision`, `device`, `backend`, `allreduce`, `dataset`, `pin_memory`, "
         "`threads_per_rank`, "
         "`batch_per_rank`, `global_batch`, `train_samples`, `test_samples`, "
         "`iterations_per_epoch`, `total_iterations`, `parameters`, `macs_per_sample`, "
         "`memory_estimate_bytes` and the categories "
         "`memory_plan_{weight,gradient,optimizer_state,activation}_bytes` and "
         "`memory_plan_{weight,gradient,optimizer_state}_shards`, `compress` (plus "
         "`powersgd_rank` and `powersgd_start_iter` under `dist.compress=powersgd`, `pipeline_*` "
         "under "
         "`run.strategy=pipeline`). `run.workload=llm` writes instead `workload`, `method`, "
         "`precision`, `device`, `backend`, `allreduce`, `model`, `dataset`, `dataset_format`, "
         "`dataset_path`, "
         "`packed`, `max_seq_len`, `tokenizer`, `pin_memory`, `threads_per_rank`, "
         "`batch_per_rank`, `gradient_accumulation`, `global_batch`, `train_samples`, "
         "`val_samples`, `val_source`, `iterations_per_epoch`, `total_iterations`, `parameters`, "
         "`trainable_parameters`, `projections`, `zero`, `activation_checkpointing`, "
         "`flops_per_token`, `memory_estimate_bytes` with its categories "
         "`memory_plan_{weight,frozen_weight,nf4_weight,trainable_weight,gradient,"
         "optimizer_state,activation,logits,gathered_weight,unit_gradient}_bytes`, the "
         "`memory_plan_*_shards`, `compress` (and the `powersgd_*` attributes) and, when adapters "
         "were saved, `adapters_dir`; with "
         "`llm.val_fraction` also the dataset `/plan/val_indices`. `run.workload=comm` writes "
         "`workload`, `device`, `backend`, `allreduce` and `dataset`."},
        {Kind::attribute, kPlan, "strategy", "", "str", "run.workload=cv",
         "`run.strategy`: `ddp-ds`, `ddp`, `dp` or `pipeline`."},
        {Kind::attribute, kPlan, "workload", "", "str", "run.workload=llm or comm",
         "`run.workload` (`llm` or `comm`; for every workload also the root attribute "
         "`workload`)."},
        {Kind::attribute, kPlan, "method", "", "str", "run.workload=llm",
         "`llm.method`: `full`, `lora`, `qlora`, `dpo` or `qat`."},
        {Kind::attribute, kPlan, "precision", "", "str", "run.workload=cv or llm",
         "`run.precision` the run used: `fp64`, `fp32`, `tf32`, `fp16-mixed`, `bf16-mixed` or "
         "`bf16`."},
        {Kind::attribute, kPlan, "device", "", "str", "",
         "Rank 0's device, e.g. `cpu` or `cuda:0`."},
        {Kind::attribute, kPlan, "backend", "", "str", "",
         "The communication backend, `mpi` or `nccl`."},
        {Kind::attribute, kPlan, "allreduce", "", "str", "",
         "How the communicator that reduces the gradients (the comm benchmark's: the one it "
         "measures) runs every allreduce: `flat` (one `MPI_Allreduce` over all ranks), "
         "`hierarchical` (the MPI backend's two-level algorithm: reduce inside each node, "
         "allreduce among one leader per node, broadcast inside the node) or `nccl` (NCCL's own, "
         "node-aware). `dist.allreduce=auto` is resolved here: hierarchical when those ranks span "
         "several nodes and some node holds several of them."},
        {Kind::attribute, kPlan, "model", "", "str", "run.workload=llm", "The Llama model's name."},
        {Kind::attribute, kPlan, "dataset", "", "str", "",
         "A description of the dataset: CV the image data, LLM the fine-tuning data; `none "
         "(communication benchmark)` for `run.workload=comm`."},
        {Kind::attribute, kPlan, "dataset_format", "", "str", "run.workload=llm",
         "`llm.dataset.format`: instruct, summarize, grammar, chat, text or preference."},
        {Kind::attribute, kPlan, "dataset_path", "", "str", "run.workload=llm",
         "`llm.dataset.path`."},
        {Kind::attribute, kPlan, "packed", "", "int", "run.workload=llm",
         "1 when sequences are packed (`llm.packed`), else 0."},
        {Kind::attribute, kPlan, "max_seq_len", "", "int", "run.workload=llm",
         "`llm.max_seq_len`: tokens per sequence at most."},
        {Kind::attribute, kPlan, "tokenizer", "", "str", "run.workload=llm",
         "The tokenizer (`llm.tokenizer`)."},
        {Kind::attribute, kPlan, "pin_memory", "", "int", "run.workload=cv or llm",
         "1 when batches were built in pinned host memory, else 0. CV: what applied of "
         "`data.pin_memory` (the request): 1 with `data.pin_memory=true` on a GPU, 0 when it was "
         "dropped on a CPU device, see [gpu.md](gpu.md#device-selection-and-binding). LLM: 1 on a "
         "GPU, where token batches are always pinned (`data.pin_memory` is not consulted)."},
        {Kind::attribute, kPlan, "threads_per_rank", "", "int", "run.workload=cv or llm",
         "LibTorch threads per rank."},
        {Kind::attribute, kPlan, "batch_per_rank", "", "int", "run.workload=cv or llm",
         "Samples per rank and step (CV); sequences per micro-batch (LLM)."},
        {Kind::attribute, kPlan, "gradient_accumulation", "", "int", "run.workload=llm",
         "Micro-batches per optimizer step (`llm.gradient_accumulation`)."},
        {Kind::attribute, kPlan, "global_batch", "", "int", "run.workload=cv or llm",
         "Samples (CV) or sequences (LLM) per optimizer step over all ranks."},
        {Kind::attribute, kPlan, "train_samples", "", "int", "run.workload=cv or llm",
         "Training samples (LLM: after the validation split)."},
        {Kind::attribute, kPlan, "test_samples", "", "int", "run.workload=cv",
         "Samples of the test split."},
        {Kind::attribute, kPlan, "val_samples", "", "int", "run.workload=llm",
         "Held-out validation samples (0 without validation)."},
        {Kind::attribute, kPlan, "val_source", "", "str", "run.workload=llm",
         "How the validation set was chosen (`llm.val_fraction` split or `llm.val_dataset.path`), "
         "or `none`."},
        {Kind::attribute, kPlan, "iterations_per_epoch", "", "int", "run.workload=cv or llm",
         "Iterations (optimizer steps) per epoch."},
        {Kind::attribute, kPlan, "total_iterations", "", "int", "run.workload=cv or llm",
         "Iterations the whole run trains."},
        {Kind::attribute, kPlan, "parameters", "", "int", "run.workload=cv or llm",
         "CV: trainable elements of the model; LLM: all weights."},
        {Kind::attribute, kPlan, "trainable_parameters", "", "int", "run.workload=llm",
         "Trainable weights (LLM)."},
        {Kind::attribute, kPlan, "projections", "", "str", "run.workload=llm",
         "The model's projections by kind, `kind:count` comma-separated, e.g. "
         "`lora:12,nf4+lora:...`."},
        {Kind::attribute, kPlan, "macs_per_sample", "", "int", "run.workload=cv",
         "Forward multiply-accumulates per sample."},
        {Kind::attribute, kPlan, "zero", "", "int", "run.workload=cv or llm",
         "`dist.zero`: the ZeRO stage, 0 to 3 (CV: 0 to 2; absent in CV files of earlier "
         "revisions, which ran 0)."},
        {Kind::attribute, kPlan, "compress", "", "str", "run.workload=cv or llm",
         "`dist.compress`: how gradients travel between ranks, `none`, `fp16`, `bf16` or "
         "`powersgd` (added in this revision; absent in older files, which sent them "
         "uncompressed)."},
        {Kind::attribute, kPlan, "powersgd_rank", "", "int",
         "run.workload=cv or llm, dist.compress=powersgd",
         "`dist.powersgd_rank`: the rank of PowerSGD's approximation of each gradient matrix."},
        {Kind::attribute, kPlan, "powersgd_start_iter", "", "int",
         "run.workload=cv or llm, dist.compress=powersgd",
         "`dist.powersgd_start_iter`: plain-allreduce iterations before PowerSGD starts."},
        {Kind::attribute, kPlan, "activation_checkpointing", "", "int", "run.workload=llm",
         "1 with activation checkpointing (`llm.activation_checkpointing`), else 0."},
        {Kind::attribute, kPlan, "loss_chunks", "", "int", "run.workload=llm",
         "`llm.loss_chunks`: token chunks of the output projection and loss (1 = unchunked)."},
        {Kind::attribute, kPlan, "sdpa_backend", "", "string", "run.workload=llm",
         "The scaled-dot-product-attention kernel this run's attention calls get, as "
         "`at::_fused_sdp_choice` reports for its heads, mask (packed or causal), device and "
         "compute dtype: `flash`, `efficient`, `cudnn` or `math`; ` (kv heads expanded)` where "
         "grouped KV heads are copied to the query heads so that a fused kernel takes the mask."},
        {Kind::attribute, kPlan, "flops_per_token", "", "float", "run.workload=llm",
         "Training FLOPs per token used for MFU: 4 N_matmul + 2 N_trainable + attention."},
        {Kind::attribute, kPlan, "build_peak_bytes", "B", "float",
         "run.workload=llm, not --dry-run",
         "Largest tensor peak of any rank while the model was built, loaded, transformed by its "
         "method and parallelised (host tensor counter on CPU, the caching allocator on GPUs). "
         "Models are materialised one unit (embedding, decoder layer, head) at a time; under "
         "`dist.zero=3` each unit is sharded before the next is built, so this falls with the "
         "rank count (a rank's shards plus about two units). Absent where nothing counts tensors "
         "(a "
         "CPU run without the host tensor counter)."},
        {Kind::attribute, kPlan, "memory_estimate_bytes", "", "float", "run.workload=cv or llm",
         "The `--dry-run` memory plan per rank (LLM: of this method, see "
         "[llm.md](llm.md#memory-plan---dry-run)), with its categories `memory_plan_*_bytes`. The "
         "plan is held against the measurements by `tests/e2e/test_memory_plan.py`: for every LLM "
         "method and the CV model on tiny CPU runs, weights, gradients and optimizer state equal "
         "the live tensors' bytes and the activations (the larger forward/backward peak of the "
         "host tensor counter above the resting state) are within 6 % (reached: 3.5 %; fp32, and "
         "bf16 for LoRA). Under fp16/bf16-mixed on CPU the activations were within 12 % when "
         "measured; on GPUs the kernels' workspaces and the caching allocator's rounding come on "
         "top."},
        {Kind::attribute, kPlan, "memory_plan_weight_bytes", "", "float", "run.workload=cv or llm",
         "Memory plan: the weights (LLM: frozen + NF4 + trainable; under `dist.zero=3` the rank's "
         "shards)."},
        {Kind::attribute, kPlan, "memory_plan_frozen_weight_bytes", "", "float", "run.workload=llm",
         "Memory plan: dense weights that are not trained (under `dist.zero=3` the rank's "
         "shards)."},
        {Kind::attribute, kPlan, "memory_plan_nf4_weight_bytes", "", "float", "run.workload=llm",
         "Memory plan: QLoRA's NF4 codes, scales and scale factors (under `dist.zero=3` the "
         "rank's shards)."},
        {Kind::attribute, kPlan, "memory_plan_trainable_weight_bytes", "", "float",
         "run.workload=llm",
         "Memory plan: trained weights (under `dist.zero=3` the rank's shards)."},
        {Kind::attribute, kPlan, "memory_plan_gradient_bytes", "", "float",
         "run.workload=cv or llm",
         "Memory plan: the gradients (CV: gradients are views into the communication buckets, no "
         "separate bucket copy; LLM under `dist.zero=3`: the rank's shards)."},
        {Kind::attribute, kPlan, "memory_plan_optimizer_state_bytes", "", "float",
         "run.workload=cv or llm",
         "Memory plan: the optimizer state (LLM under `dist.zero=3`: the rank's shards)."},
        {Kind::attribute, kPlan, "memory_plan_activation_bytes", "", "float",
         "run.workload=cv or llm",
         "Memory plan: activations. CV: the input batch and what autograd keeps for backward: 3 "
         "tensors of each conv + batch-norm + ReLU6 output, 2 of each linear projection's. LLM: "
         "the activation count per method is documented in `modules/train/src/llm_memory.cpp`; "
         "the same under every `dist.zero` stage."},
        {Kind::attribute, kPlan, "memory_plan_logits_bytes", "", "float", "run.workload=llm",
         "Memory plan: the loss head's logit buffers, the same under every `dist.zero` stage (see "
         "[llm.md](llm.md#memory-plan---dry-run))."},
        {Kind::attribute, kPlan, "memory_plan_gathered_weight_bytes", "", "float",
         "run.workload=llm",
         "Memory plan: under `dist.zero=3`, the full weights of the units gathered at once; 0 "
         "otherwise."},
        {Kind::attribute, kPlan, "memory_plan_unit_gradient_bytes", "", "float", "run.workload=llm",
         "Memory plan: under `dist.zero=3`, one unit's full gradient (during its backward, before "
         "its reduce-scatter); 0 otherwise."},
        {Kind::attribute, kPlan, "memory_plan_workspace_bytes", "", "float", "run.workload=llm",
         "Memory plan: on a GPU, LibTorch's cuBLAS workspaces, which its caching allocator "
         "counts: two of `at::cuda::getChosenWorkspaceSize()` (`CUBLAS_WORKSPACE_CONFIG`, else "
         "32 MiB from Hopper on), one for the step's thread and one for autograd's device "
         "thread; 0 on the CPU."},
        {Kind::attribute, kPlan, "memory_plan_comm_buffer_bytes", "", "float",
         "run.workload=cv or llm",
         "Memory plan: under `dist.zero=0` at more than one rank (DDP), what the gradient "
         "synchronizer keeps beside the gradients: on the MPI backend a float32 copy of 16-bit "
         "gradients (what the allreduce runs on), with `dist.compress=fp16/bf16` a 16-bit copy, "
         "with `dist.compress=powersgd` the uncompressed tensors, the error feedback and P and Q "
         "(one element per gradient element, plus P and Q); under `dist.zero=1/2` with "
         "`dist.compress=fp16/bf16` the reduce-scatter's 16-bit shard; 0 otherwise (CV: also "
         "under `run.strategy=dp` and `pipeline`)."},
        {Kind::attribute, kPlan, "memory_plan_weight_shards", "", "int", "run.workload=cv or llm",
         "Over how many ranks the memory plan divides the weights (1: every rank holds all of "
         "them): `dist.zero=3` (FSDP) divides them over the data-parallel ranks; always 1 for CV, "
         "which has no ZeRO. Recorded so that readers (the advisor) scale the memory plan to "
         "other rank counts without re-deriving the rules."},
        {Kind::attribute, kPlan, "memory_plan_gradient_shards", "", "int", "run.workload=cv or llm",
         "Over how many ranks the memory plan divides the gradients (1: every rank holds all of "
         "them): `dist.zero` 2 and 3 divide them over the data-parallel ranks; always 1 for CV."},
        {Kind::attribute, kPlan, "memory_plan_optimizer_state_shards", "", "int",
         "run.workload=cv or llm",
         "Over how many ranks the memory plan divides the optimizer state (1: every rank holds "
         "all of it): `dist.zero` 1, 2 and 3 divide it over the data-parallel ranks; always 1 for "
         "CV."},
        {Kind::attribute, kPlan, "adapters_dir", "", "str", "run.workload=llm, adapters saved",
         "The PEFT adapter directory the trained LoRA adapters were written to at the end of "
         "training (`llm.save_adapters`), see [llm.md](llm.md#lora-adapters-peft)."},
        {Kind::attribute, kPlan, "pipeline_stages", "", "int", "run.strategy=pipeline",
         "Pipeline stages (`pipeline.stages`): consecutive ranks; rank = replica × stages + "
         "stage."},
        {Kind::attribute, kPlan, "pipeline_replicas", "", "int", "run.strategy=pipeline",
         "Data-parallel replicas of the pipeline (world size ÷ stages)."},
        {Kind::attribute, kPlan, "pipeline_microbatches", "", "int", "run.strategy=pipeline",
         "GPipe micro-batches per batch (`pipeline.microbatches`)."},
        {Kind::attribute, kPlan, "pipeline_stage_first_units", "", "str", "run.strategy=pipeline",
         "The model unit each stage begins with, comma-separated, stage 0 first (units: 0-18 "
         "features, 19 head; see `--dry-run`)."},
        {Kind::vector, kPlanValIndices, "", "1", "", "llm.val_fraction > 0",
         "float64 [val_samples], written at the end of training: the held-out samples' 0-based "
         "positions in `llm.dataset.path` (after `llm.max_samples`), for re-evaluating them "
         "elsewhere."},
        {Kind::compound, kRanks, "", "1", "", "",
         "Compound dataset [world_size], one row per rank, row r written by rank r: where each "
         "rank runs. String fields are fixed-length (as wide as the longest value on any rank), "
         "NUL-padded; h5py returns them as `bytes`."},
        {Kind::field, kRanks, "rank", "", "int32", "", "MPI rank in the world communicator."},
        {Kind::field, kRanks, "local_rank", "", "int32", "", "Rank among the ranks of its node."},
        {Kind::field, kRanks, "node", "", "int32", "", "Node index (0 .. num_nodes-1)."},
        {Kind::field, kRanks, "hostname", "", "fixed str", "", "Host name."},
        {Kind::field, kRanks, "pid", "", "int64", "", "Process id."},
        {Kind::field, kRanks, "device", "", "fixed str", "", "`cpu`, `cuda:0`, ..."},
        {Kind::field, kRanks, "device_name", "", "fixed str", "", "E.g. the GPU model."},
        {Kind::field, kRanks, "pci_bus_id", "", "fixed str", "", "GPU PCI bus id, empty on CPU."},
        {Kind::field, kRanks, "cpu_affinity", "", "fixed str", "",
         "CPU list the rank may run on, e.g. `0-15`."},
        {Kind::series, kIterations, "", "", "", "run.workload=cv or llm",
         "Per-iteration series of every training run, one row per rank and iteration (NaN where a "
         "value does not exist on this run). A per-rank series group: each column is a 2-D "
         "float64 dataset `/<group>/<column>` [R, n] with its `units`; row j belongs to rank "
         "`ranks[j]` (R = world_size and row r = rank r unless `output.per_rank` keeps fewer "
         "ranks), column i is that rank's i-th record; `aggregate/` holds every row's min, mean, "
         "max, argmax and slowest rank over all ranks. Datasets are chunked [R, K] (K: the run's "
         "expected rows rounded up to a power of two, 8 to 1 MiB per chunk) and "
         "extendable along n (max shape [R, unlimited]); each rank writes its own row "
         "block with independent I/O, no fill values. Ranks may record different numbers of "
         "rows; n is the longest rank's count and the missing tail of a shorter rank is NaN, "
         "written by that rank (see `rank_rows`). With `profile.accounting=false` the accounting "
         "columns (`comm_*`, state "
         "bytes, memory counters) are NaN: that switch exists to measure the accounting's own "
         "cost."},
        {Kind::attribute, kIterations, "columns", "", "str", "",
         "Column names in the writer's order, comma-separated."},
        {Kind::attribute, kIterations, "rows", "", "int", "", kSeriesRowsMeaning},
        {Kind::per_rank, "/iterations/rank_rows", "", "1", "int64", "run.workload=cv or llm",
         kRankRowsMeaning},
        {Kind::per_rank, "/iterations/ranks", "", "1", "int64", "run.workload=cv or llm",
         kRanksMeaning},
        {Kind::group, "/iterations/aggregate", "", "", "", "", kAggregateGroupMeaning},
        {Kind::attribute, "/iterations/aggregate", "rows", "", "int", "", kAggregateRowsMeaning},
        {Kind::attribute, "/iterations/aggregate", "slowest_by", "", "str", "",
         kAggregateSlowestByMeaning},
        {Kind::compound, "/iterations/aggregate/{column}", "", "the column's", "", "",
         kAggregateMeaning},
        {Kind::field, "/iterations/aggregate/{column}", "min", "", "float64", "",
         "Smallest value."},
        {Kind::field, "/iterations/aggregate/{column}", "mean", "", "float64", "",
         "Mean over the ranks counted."},
        {Kind::field, "/iterations/aggregate/{column}", "max", "", "float64", "", "Largest value."},
        {Kind::field, "/iterations/aggregate/{column}", "argmax", "", "int64", "",
         "The rank holding `max` (the lowest on a tie); -1 when no rank has a value."},
        {Kind::field, "/iterations/aggregate/{column}", "count", "", "int64", "",
         "Ranks with a finite value in this row."},
        {Kind::field, "/iterations/aggregate/{column}", "slowest", "", "float64", "",
         "The value on the row's slowest rank: the rank with the largest `slowest_by` value "
         "(`aggregate/<slowest_by>` `argmax`)."},
        {Kind::column, kIterations, "iteration", "1", "", "",
         "0-based iteration number, counted over the run (a file written by `--resume` starts at "
         "`resumed_from_iteration`)."},
        {Kind::column, kIterations, "epoch", "1", "", "",
         "0-based epoch the iteration belongs to."},
        {Kind::column, kIterations, "t_start", "s", "", "",
         "Run clock (shared with `/telemetry/t_s`) when the iteration began."},
        {Kind::column, kIterations, "flush_s", "s", "", "",
         "The own work of the run-file flush this rank made between the previous iteration and "
         "this one (after all ranks had entered it; the tool's own cost, outside every phase and "
         "`step_s`), 0 where there was none. The flush at the end of the run is in "
         "`/summary@flush_total_s` only."},
        {Kind::column, kIterations, "data_s", "s", "", "",
         "Time of the `data` phase (CUDA events on GPU)."},
        {Kind::column, kIterations, "h2d_s", "s", "", "",
         "Time of the `h2d` phase (CUDA events on GPU); includes device-side preprocessing "
         "(`data.preprocess=device`)."},
        {Kind::column, kIterations, "forward_s", "s", "", "",
         "Time of the `forward` phase (CUDA events on GPU)."},
        {Kind::column, kIterations, "backward_s", "s", "", "",
         "Time of the `backward` phase (CUDA events on GPU)."},
        {Kind::column, kIterations, "comm_wait_s", "s", "", "",
         "Time of the `comm_wait` phase (CUDA events on GPU): the exposed (waited-for) gradient "
         "communication of the workload (LLM SFT: also the sum of the global batch's label-token "
         "count, which the gradient scale needs)."},
        {Kind::column, kIterations, "optimizer_s", "s", "", "",
         "Time of the `optimizer` phase (CUDA events on GPU)."},
        {Kind::column, kIterations, "control_s", "s", "", "",
         "Time of the `control` phase: what the harness does for itself, between `comm_wait` and "
         "`optimizer`: the non-finite flag on the device (read here only under "
         "`run.nonfinite=skip`; `abort` reads it with the deferred losses), the fp16 loss "
         "scaler's inf/NaN verdict (one read), and one host-side allreduce of the ranks' "
         "stop/checkpoint/non-finite flags. Never folded into the other phases (added in this "
         "revision; absent in older files)."},
        {Kind::column, kIterations, "step_s", "s", "", "",
         "First phase start to last phase end (all phases, `control` included)."},
        {Kind::column, kIterations, "loss", "1", "", "",
         "Training loss of the rank's batch (unscaled)."},
        {Kind::column, kIterations, "samples", "samples", "", "", "Samples this rank processed."},
        {Kind::column, kIterations, "lr", "1", "", "", "Learning rate used."},
        {Kind::column, kIterations, "comm_bytes", "B", "", "",
         "Bytes this rank allreduced for gradients, as sent (half/bf16 gradients travel as fp32 on "
         "the MPI backend; under `dist.compress` the compressed payload: 16-bit buckets, or "
         "PowerSGD's uncompressed members + P + Q). Under `dist.zero=3`: all-gather + "
         "reduce-scatter bytes."},
        {Kind::column, kIterations, "comm_collective_s", "s", "", "",
         "Time inside those collectives where they ran (MPI progress thread / CUDA events): the "
         "sum over buckets of each allreduce's own duration. Under `dist.zero=3`: the "
         "all-gathers' and reduce-scatters' durations. Under `dist.compress` the compressed "
         "collectives' own durations (PowerSGD: per bucket its uncompressed, P and Q allreduces; "
         "the compression's computation between them is in `comm_wait_s`, not here)."},
        {Kind::column, kIterations, "comm_uncompressed_bytes", "B", "", "",
         "What the same gradient collectives would have sent without `dist.compress` (equal to "
         "`comm_bytes` under `dist.compress=none`, and in PowerSGD's plain iterations before "
         "`dist.powersgd_start_iter`); `comm_bytes / comm_uncompressed_bytes` is the "
         "compression ratio. Added in this revision (absent in older files)."},
        {Kind::column, kIterations, "comm_error_norm", "1", "", "",
         "`dist.compress=powersgd`: L2 norm of this rank's error feedback after the iteration "
         "(the part of its gradients PowerSGD has not sent yet, added to the next iteration's), "
         "0 before `dist.powersgd_start_iter`; NaN for the other modes and at one rank (nothing is "
         "compressed). Added in this revision "
         "(absent in older files)."},
        {Kind::column, kIterations, "parameter_bytes", "B", "", "",
         "Model parameters held by the rank. LLM: frozen + NF4 + trainable; under `dist.zero=3` "
         "this rank's shards (1/N plus padding)."},
        {Kind::column, kIterations, "gradient_bytes", "B", "", "",
         "Gradients held by the rank. LLM: the trainable gradients held (ZeRO: the full buffer "
         "and/or the shard); under `dist.zero=3` this rank's shards."},
        {Kind::column, kIterations, "optimizer_state_bytes", "B", "", "",
         "Optimizer state held by the rank (LLM: AdamW's moments; ZeRO: this rank's shard)."},
        {Kind::column, kIterations, "host_rss_bytes", "B", "", "", "`/proc/self/status` VmRSS."},
        {Kind::column, kIterations, "host_peak_rss_bytes", "B", "", "",
         "`/proc/self/status` VmHWM."},
        {Kind::column, kIterations, "host_tensor_bytes", "B", "", "",
         "Live LibTorch CPU tensor storage (on every device), from trainscope's counting CPU "
         "allocator (installed at start; LibTorch's allocation with a 64-byte size header). "
         "Unlike RSS it excludes freed heap the C library keeps and memory outside tensors "
         "(oneDNN scratch, MPI, HDF5)."},
        {Kind::column, kIterations, "host_tensor_peak_bytes", "B", "", "",
         "Peak of `host_tensor_bytes` within the iteration. On CPU runs the figure to compare "
         "with `torch.cuda.max_memory_allocated`."},
        {Kind::column, kIterations, "device_allocated_bytes", "B", "", "",
         "CUDA caching allocator: allocated, current (NaN on CPU)."},
        {Kind::column, kIterations, "device_allocated_peak_bytes", "B", "", "",
         "CUDA caching allocator: allocated, peak within the iteration (a window started at every "
         "iteration; the per-phase resets fold what they saw into it first, so work between "
         "phases counts too)."},
        {Kind::column, kIterations, "device_reserved_bytes", "B", "", "",
         "CUDA caching allocator: reserved, current (NaN on CPU)."},
        {Kind::column, kIterations, "device_reserved_peak_bytes", "B", "", "",
         "CUDA caching allocator: reserved, peak within the iteration (as "
         "`device_allocated_peak_bytes`)."},
        {Kind::column, kIterations, "device_active_bytes", "B", "", "",
         "CUDA caching allocator: active, current (NaN on CPU)."},
        {Kind::column, kIterations, "device_active_peak_bytes", "B", "", "",
         "CUDA caching allocator: active, peak within the iteration (as "
         "`device_allocated_peak_bytes`)."},
        {Kind::column, kIterations, "device_alloc_retries", "1", "", "",
         "Allocator retries after freeing its cache, cumulative."},
        {Kind::column, kIterations, "device_ooms", "1", "", "",
         "Out-of-memory errors the allocator raised, cumulative."},
        {Kind::column, kIterations, "device_free_bytes", "B", "", "",
         "`cudaMemGetInfo` free (all processes on the device)."},
        {Kind::column, kIterations, "device_total_bytes", "B", "", "",
         "`cudaMemGetInfo` total (all processes on the device)."},
        {Kind::column, kIterations, "forward_peak_bytes", "B", "", "",
         "`forward` allocator peak within that phase: the CUDA caching allocator's on GPUs, the "
         "host tensor counter's on CPU; a phase repeated per micro-batch keeps its largest peak."},
        {Kind::column, kIterations, "backward_peak_bytes", "B", "", "",
         "`backward` allocator peak within that phase: the CUDA caching allocator's on GPUs, the "
         "host tensor counter's on CPU; a phase repeated per micro-batch keeps its largest peak."},
        {Kind::column, kIterations, "optimizer_peak_bytes", "B", "", "",
         "`optimizer` allocator peak within that phase: the CUDA caching allocator's on GPUs, the "
         "host tensor counter's on CPU; a phase repeated per micro-batch keeps its largest peak."},
        {Kind::column, kIterations, "loss_scale", "1", "", "",
         "fp16-mixed: the dynamic loss scale used for this backward (NaN otherwise)."},
        {Kind::column, kIterations, "step_skipped", "1", "", "",
         "1 when the optimizer step was skipped for inf/NaN gradients (fp16-mixed), else 0."},
        {Kind::column, kIterations, "nonfinite_skipped", "1", "", "",
         "1 when `run.nonfinite=skip` dropped this iteration's step because some rank's loss or "
         "gradient was NaN/Inf (the same on every rank), else 0."},
        {Kind::column, kIterations, "host_syncs", "1", "", "",
         "Device-to-host reads the harness made within this iteration (each one a host "
         "synchronisation on a GPU; counted on CPU too): 0 for an fp32/tf32/bf16 step under "
         "`run.nonfinite=abort`, 1 under `run.nonfinite=skip` (the flag) or `fp16-mixed` (the "
         "loss scaler's verdict). Reads at loss resolution, checkpoints and evaluation happen "
         "between iterations and are not counted (added in issue 25; absent in older files)."},
        {Kind::column, kIterations, "tokens", "tokens", "", "",
         "Token workloads (`run.workload=llm`): non-padding tokens this rank processed in the "
         "iteration (all micro-batches; NaN for images)."},
        {Kind::column, kIterations, "label_tokens", "tokens", "", "",
         "Of those tokens, the ones with a label after the shift (what the SFT loss averages "
         "over)."},
        {Kind::column, kIterations, "padding_fraction", "1", "", "run.workload=llm",
         "Padding cells ÷ all cells of the padded batches."},
        {Kind::column, kIterations, "seq_len_max", "tokens", "", "run.workload=llm",
         "Longest sequence before padding (packed: pack length)."},
        {Kind::column, kIterations, "seq_len_min", "tokens", "", "run.workload=llm",
         "Shortest sequence before padding (packed: pack length)."},
        {Kind::column, kIterations, "sequences", "1", "", "run.workload=llm",
         "Sequences through the model (DPO: chosen + rejected)."},
        {Kind::column, kIterations, "dpo_reward_chosen", "nats", "", "run.workload=llm",
         "DPO: mean of beta (log pi − log ref) over the pairs' chosen responses (NaN for other "
         "methods)."},
        {Kind::column, kIterations, "dpo_reward_rejected", "nats", "", "run.workload=llm",
         "DPO: mean of beta (log pi − log ref) over the pairs' rejected responses (NaN for other "
         "methods)."},
        {Kind::column, kIterations, "dpo_reward_margin", "nats", "", "run.workload=llm",
         "DPO: mean of chosen − rejected reward."},
        {Kind::column, kIterations, "dpo_reward_accuracy", "1", "", "run.workload=llm",
         "DPO: fraction of pairs whose chosen reward exceeds the rejected one."},
        {Kind::column, kIterations, "qat_enabled", "1", "", "run.workload=llm",
         "QAT: 1 once fake quantisation is on (`llm.qat.start_step`), NaN for other methods."},
        {Kind::column, kIterations, "frozen_weight_bytes", "B", "", "run.workload=llm",
         "Dense weights that are not trained (LoRA base, embeddings and norms of QLoRA)."},
        {Kind::column, kIterations, "nf4_weight_bytes", "B", "", "run.workload=llm",
         "QLoRA: NF4 codes, scales and scale factors."},
        {Kind::column, kIterations, "trainable_weight_bytes", "B", "", "run.workload=llm",
         "Trained weights (adapters, or all weights)."},
        {Kind::column, kIterations, "allgather_bytes", "B", "", "run.workload=llm",
         "`dist.zero=3`: this rank's shard bytes sent in the per-unit parameter all-gathers of "
         "the iteration (forward, backward re-gathers, DPO's reference forward; nccl-tests' "
         "\"size\" convention: the input), NaN otherwise."},
        {Kind::column, kIterations, "allgather_s", "s", "", "run.workload=llm",
         "`dist.zero=3`: the all-gathers' own durations summed (MPI: on the progress thread; "
         "NCCL: CUDA events)."},
        {Kind::column, kIterations, "allgather_exposed_s", "s", "", "run.workload=llm",
         "`dist.zero=3`: time the computation waited for an all-gather (inside `forward_s` / "
         "`backward_s`; MPI: the training thread's host wait; NCCL: how long the compute stream "
         "stalled at the wait, from CUDA events). Hidden = `allgather_s` − exposed. MPI's one "
         "progress thread runs the asynchronous collectives in issue order, so a wait may include "
         "a reduce-scatter queued before the all-gather: the share hidden is only exact for both "
         "kinds together."},
        {Kind::column, kIterations, "reduce_scatter_bytes", "B", "", "run.workload=llm",
         "`dist.zero=3`: the per-unit gradient reduce-scatters' bytes (this rank's output share)."},
        {Kind::column, kIterations, "reduce_scatter_s", "s", "", "run.workload=llm",
         "`dist.zero=3`: the reduce-scatters' durations summed."},
        {Kind::column, kIterations, "reduce_scatter_exposed_s", "s", "", "run.workload=llm",
         "`dist.zero=3`: time the training thread waited for the reduce-scatters (in `backward_s` "
         "when at most two were in flight, else in `comm_wait_s`)."},
        {Kind::column, kIterations, "gathered_weight_bytes", "B", "", "run.workload=llm",
         "`dist.zero=3`: unit weights still gathered when the iteration is accounted (0 unless a "
         "unit leaked; the gathered units' transient memory shows in the phase peaks)."},
        {Kind::series, kEpochs, "", "", "", "run.workload=cv or llm",
         "Per-epoch series, a per-rank series group like `/iterations` [world_size, n_epoch]. The "
         "validation values are reduced over ranks (the same on every rank): CV = the test "
         "split's mean cross-entropy and top-1 accuracy; LLM = the held-out set's summed token "
         "cross-entropy ÷ its label tokens (SFT; `val_accuracy` NaN), or the DPO loss per pair "
         "and the share of pairs whose chosen reward beats the rejected one (`val_accuracy`), see "
         "[llm.md](llm.md#validation-llmval_fraction-llmval_datasetpath). An epoch interrupted in "
         "the middle is recorded only by the segment (`--resume`) that finishes it."},
        {Kind::attribute, kEpochs, "columns", "", "str", "",
         "Column names in the writer's order, comma-separated."},
        {Kind::attribute, kEpochs, "rows", "", "int", "", kSeriesRowsMeaning},
        {Kind::per_rank, "/epochs/rank_rows", "", "1", "int64", "run.workload=cv or llm",
         kRankRowsMeaning},
        {Kind::per_rank, "/epochs/ranks", "", "1", "int64", "run.workload=cv or llm",
         kRanksMeaning},
        {Kind::group, "/epochs/aggregate", "", "", "", "", kAggregateGroupMeaning},
        {Kind::attribute, "/epochs/aggregate", "rows", "", "int", "", kAggregateRowsMeaning},
        {Kind::attribute, "/epochs/aggregate", "slowest_by", "", "str", "",
         kAggregateSlowestByMeaning},
        {Kind::compound, "/epochs/aggregate/{column}", "", "the column's", "", "",
         kAggregateMeaning},
        {Kind::field, "/epochs/aggregate/{column}", "min", "", "float64", "", "Smallest value."},
        {Kind::field, "/epochs/aggregate/{column}", "mean", "", "float64", "",
         "Mean over the ranks counted."},
        {Kind::field, "/epochs/aggregate/{column}", "max", "", "float64", "", "Largest value."},
        {Kind::field, "/epochs/aggregate/{column}", "argmax", "", "int64", "",
         "The rank holding `max` (the lowest on a tie); -1 when no rank has a value."},
        {Kind::field, "/epochs/aggregate/{column}", "count", "", "int64", "",
         "Ranks with a finite value in this row."},
        {Kind::field, "/epochs/aggregate/{column}", "slowest", "", "float64", "",
         "The value on the row's slowest rank: the rank with the largest `slowest_by` value "
         "(`aggregate/<slowest_by>` `argmax`)."},
        {Kind::column, kEpochs, "epoch", "1", "", "", "0-based epoch."},
        {Kind::column, kEpochs, "epoch_s", "s", "", "",
         "Duration of the epoch, evaluation included."},
        {Kind::column, kEpochs, "train_loss", "1", "", "",
         "Mean training loss of the rank's iterations in the epoch (after `--resume`: over this "
         "segment's part of the epoch)."},
        {Kind::column, kEpochs, "val_loss", "1", "", "",
         "Validation loss (CV: the test split's mean cross-entropy; LLM: see the group); NaN when "
         "the run does not evaluate."},
        {Kind::column, kEpochs, "val_accuracy", "1", "", "",
         "Validation accuracy as a fraction: CV top-1 accuracy; DPO the share of pairs whose "
         "chosen reward beats the rejected one; NaN for LLM SFT."},
        {Kind::column, kEpochs, "samples", "samples", "", "",
         "Samples this rank processed in the epoch."},
        {Kind::column, kEpochs, "val_perplexity", "1", "", "",
         "exp(`val_loss`): LLM SFT methods with a validation set; NaN for DPO and CV."},
        {Kind::column, kEpochs, "eval_s", "s", "", "",
         "The end-of-epoch evaluation, outside every iteration and phase; NaN when the run does "
         "not evaluate."},
    };
    return t;
}

} // namespace

const std::vector<Entry>& table() {
    static const std::vector<Entry> t = [] {
        std::vector<Entry> all = run_entries();
        const std::vector<Entry>& results = result_entries();
        all.insert(all.end(), results.begin(), results.end());
        return all;
    }();
    return t;
}

} // namespace trainscope::io::schema
