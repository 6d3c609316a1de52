// The run file's schema as one table (declared in trainscope/io/schema.hpp): every group,
// dataset, series column, table column, compound field and attribute the application writes, in
// the order of docs/run_file_schema.md. RunFile checks every object it writes against it; the
// reference tables of docs/run_file_schema.md and postprocess/trainscope_post/schema.py are
// generated from it (scripts/gen_schema), so each `meaning` is Markdown, one paragraph, without
// table separators.
#include "trainscope/io/schema.hpp"

namespace trainscope::io::schema {

const std::vector<Entry>& table() {
    // Entry: kind, path (a schema.hpp constant; for attribute/column/field the object they are of),
    // name, units, type, when, meaning.
    static const std::vector<Entry> t = {
        {Kind::group, kRoot, "", "", "", "",
         "The file's root group. Every trainscope job writes one HDF5 file (`output.file`, "
         "default `trainscope_run.h5`); all ranks create and write it together through parallel "
         "HDF5 (MPI-IO driver, collective metadata operations, collective raw-data writes). "
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
         "up to `flushed_utc` are valid, later ones lost, and which has no `/summary`. A job "
         "killed during a flush can leave a file HDF5 cannot open (HDF5 1.10 has no journaling "
         "for parallel files); the window is the few milliseconds of a flush."},
        {Kind::attribute, kRoot, "created_utc", "", "str", "",
         "When the file was created (rank 0's clock)."},
        {Kind::attribute, kRoot, "flushed_utc", "", "str", "",
         "The last collective flush; the file holds every row recorded before it. Ranks buffer "
         "rows in memory and write them in a collective flush every `output.flush_every` "
         "iterations and when the run ends (also when it ends with an error all ranks agreed on); "
         "each flush writes the rows, updates `rows`, `rank_rows` and `flushed_utc`, and flushes "
         "HDF5's metadata to the file, so the file is complete and readable after every flush."},
        {Kind::attribute, kRoot, "finished_utc", "", "str", "status is not running",
         "When a final status (`completed`, `failed` or `interrupted`) was written; absent while "
         "`running`."},
        {Kind::attribute, kRoot, "world_size", "", "int", "",
         "Number of ranks = the first dimension of every per-rank series and dataset."},
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
         "`precision`, `device`, `backend`, `dataset`, `pin_memory`, `threads_per_rank`, "
         "`batch_per_rank`, `global_batch`, `train_samples`, `test_samples`, "
         "`iterations_per_epoch`, `total_iterations`, `parameters`, `macs_per_sample`, "
         "`memory_estimate_bytes` and the categories "
         "`memory_plan_{weight,gradient,optimizer_state,activation}_bytes` and "
         "`memory_plan_{weight,gradient,optimizer_state}_shards` (plus `pipeline_*` under "
         "`run.strategy=pipeline`). `run.workload=llm` writes instead `workload`, `method`, "
         "`precision`, `device`, `backend`, `model`, `dataset`, `dataset_format`, `dataset_path`, "
         "`packed`, `max_seq_len`, `tokenizer`, `pin_memory`, `threads_per_rank`, "
         "`batch_per_rank`, `gradient_accumulation`, `global_batch`, `train_samples`, "
         "`val_samples`, `val_source`, `iterations_per_epoch`, `total_iterations`, `parameters`, "
         "`trainable_parameters`, `projections`, `zero`, `activation_checkpointing`, "
         "`flops_per_token`, `memory_estimate_bytes` with its categories "
         "`memory_plan_{weight,frozen_weight,nf4_weight,trainable_weight,gradient,"
         "optimizer_state,activation,logits,gathered_weight,unit_gradient}_bytes`, the "
         "`memory_plan_*_shards` and, when adapters were saved, `adapters_dir`; with "
         "`llm.val_fraction` also the dataset `/plan/val_indices`. `run.workload=comm` writes "
         "`workload`, `device`, `backend` and `dataset`."},
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
        {Kind::attribute, kPlan, "zero", "", "int", "run.workload=llm",
         "`dist.zero`: the ZeRO stage, 0 to 3."},
        {Kind::attribute, kPlan, "activation_checkpointing", "", "int", "run.workload=llm",
         "1 with activation checkpointing (`llm.activation_checkpointing`), else 0."},
        {Kind::attribute, kPlan, "flops_per_token", "", "float", "run.workload=llm",
         "Training FLOPs per token used for MFU: 4 N_matmul + 2 N_trainable + attention."},
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
         "float64 dataset `/<group>/<column>` [world_size, n] with its `units`; row r belongs to "
         "rank r, column i is that rank's i-th record. Datasets are chunked [1, K] (K = 1024 by "
         "default, so a chunk is written by one rank only) and extendable along n (max shape "
         "[world_size, unlimited]). Ranks may record different numbers of rows; n is the longest "
         "rank's count and the missing tail of a shorter rank is the fill value NaN (see "
         "`rank_rows`). With `profile.accounting=false` the accounting columns (`comm_*`, state "
         "bytes, memory counters) are NaN: that switch exists to measure the accounting's own "
         "cost."},
        {Kind::attribute, kIterations, "columns", "", "str", "",
         "Column names in the writer's order, comma-separated."},
        {Kind::attribute, kIterations, "rows", "", "int", "",
         "`n`, the second dimension of every dataset in the group; updated at every flush."},
        {Kind::attribute, kIterations, "rank_rows", "", "int64[world_size]", "",
         "Rows rank r actually wrote (≤ `rows`); updated at every flush. Use it, not `isnan`, to "
         "know how many rows each rank really wrote: a rank may also record NaN on purpose (e.g. "
         "no validation loss that epoch)."},
        {Kind::column, kIterations, "iteration", "1", "", "",
         "0-based iteration number, counted over the run (a file written by `--resume` starts at "
         "`resumed_from_iteration`)."},
        {Kind::column, kIterations, "epoch", "1", "", "",
         "0-based epoch the iteration belongs to."},
        {Kind::column, kIterations, "t_start", "s", "", "",
         "Run clock (shared with `/telemetry/t_s`) when the iteration began."},
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
         "Bytes this rank allreduced for gradients (half/bf16 gradients travel as fp32 on the MPI "
         "backend). Under `dist.zero=3`: all-gather + reduce-scatter bytes."},
        {Kind::column, kIterations, "comm_collective_s", "s", "", "",
         "Time inside those collectives where they ran (MPI progress thread / CUDA events): the "
         "sum over buckets of each allreduce's own duration. Under `dist.zero=3`: the "
         "all-gathers' and reduce-scatters' durations."},
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
        {Kind::attribute, kEpochs, "rows", "", "int", "",
         "`n`, the second dimension of every dataset in the group; updated at every flush."},
        {Kind::attribute, kEpochs, "rank_rows", "", "int64[world_size]", "",
         "Rows rank r actually wrote (≤ `rows`); updated at every flush. Use it, not `isnan`, to "
         "know how many rows each rank really wrote: a rank may also record NaN on purpose (e.g. "
         "no validation loss that epoch)."},
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
        {Kind::group, kSummary, "", "", "", "run.workload=cv or llm",
         "Attributes computed collectively at the end of a training run; units are in the names "
         "(`_s` seconds, `_bytes` bytes, `_samples_per_s`, `_j` joules). Statistics use the "
         "measured iterations: all but the first `profile.warmup_iters`. `/summary` is also "
         "written when a stop signal ended the run (`status = interrupted`); it then covers the "
         "iterations that ran."},
        {Kind::attribute, kSummary, "total_iterations", "", "int", "",
         "Iterations this process ran (all, warm-up included)."},
        {Kind::attribute, kSummary, "warmup_iterations", "", "int", "",
         "`profile.warmup_iters`: the first iterations the statistics leave out."},
        {Kind::attribute, kSummary, "measured_iterations", "", "int", "",
         "Iterations the statistics use (the common prefix of the ranks' measured iterations)."},
        {Kind::attribute, kSummary, "warning", "", "str", "measured_iterations = 0",
         "Only when `measured_iterations` is 0: every iteration run was warm-up "
         "(`profile.warmup_iters` ≥ the iterations run, or the run stopped before the first "
         "measured one), so the timing, throughput, MFU and energy statistics are NaN. Rank 0 "
         "also warns at start when `profile.warmup_iters` ≥ the iterations to run, and the "
         "printed summary repeats the warning under its title."},
        {Kind::attribute, kSummary, "wall_s", "", "float", "",
         "Training wall time (includes evaluation and flushes)."},
        {Kind::attribute, kSummary, "median_step_s", "", "float", "",
         "Per iteration the mean over ranks of the step time (ranks run in lock-step, so each "
         "measures the same cycle), then the median over iterations."},
        {Kind::attribute, kSummary, "p95_step_s", "", "float", "",
         "Per iteration the mean over ranks of the step time, then the 95th percentile over "
         "iterations."},
        {Kind::attribute, kSummary, "mean_step_s", "", "float", "",
         "Per iteration the mean over ranks of the step time, then the mean over iterations."},
        {Kind::attribute, kSummary, "median_slowest_rank_step_s", "", "float", "",
         "Per iteration the slowest rank's step time, then the median (≥ `median_step_s`; the gap "
         "shows skew between ranks)."},
        {Kind::attribute, kSummary, "median_{phase}_s", "", "float", "",
         "For each phase (`data`, `h2d`, `forward`, `backward`, `comm_wait`, `optimizer`, "
         "`control`): per iteration the mean over ranks of that phase, then the median over "
         "iterations."},
        {Kind::attribute, kSummary, "p95_{phase}_s", "", "float", "",
         "For each phase (`data`, `h2d`, `forward`, `backward`, `comm_wait`, `optimizer`, "
         "`control`): per iteration the mean over ranks of that phase, then the 95th percentile "
         "over iterations."},
        {Kind::attribute, kSummary, "global_batch_samples", "", "float", "",
         "Samples per step over all ranks."},
        {Kind::attribute, kSummary, "throughput_samples_per_s", "", "float", "",
         "Global batch ÷ `median_step_s`."},
        {Kind::attribute, kSummary, "tokens", "", "float", "token workloads (run.workload=llm)",
         "Token workloads: all ranks' non-padding tokens of the measured iterations."},
        {Kind::attribute, kSummary, "throughput_tokens_per_s", "", "float",
         "token workloads (run.workload=llm)",
         "Token workloads: `tokens` ÷ the sum of the measured iterations' (rank-mean) step times."},
        {Kind::attribute, kSummary, "throughput_tokens_per_s_per_rank", "", "float",
         "token workloads (run.workload=llm)", "`throughput_tokens_per_s` ÷ world size."},
        {Kind::attribute, kSummary, "flops_per_token", "", "float",
         "token workloads (run.workload=llm)",
         "Training FLOPs per token the model FLOP/s use (as `/plan@flops_per_token`)."},
        {Kind::attribute, kSummary, "model_flops_per_s_per_device", "", "float",
         "measured_iterations > 0",
         "Model FLOP/s per device: token workloads token throughput × `flops_per_token` ÷ world "
         "size; CV 6 × forward MACs × global batch ÷ `median_step_s` ÷ world size."},
        {Kind::attribute, kSummary, "mfu", "", "float", "device in the peak table",
         "Model FLOP utilisation: `model_flops_per_s_per_device` ÷ `mfu_peak_flops`. `mfu*` only "
         "for devices in the peak table (H100 SXM/PCIe, H200, A100)."},
        {Kind::attribute, kSummary, "mfu_peak_flops", "", "float", "device in the peak table",
         "The device's dense peak FLOP/s for the arithmetic `run.precision` runs its matmuls in "
         "(`mfu_peak_basis`)."},
        {Kind::attribute, kSummary, "mfu_peak_basis", "", "str", "device in the peak table",
         "The arithmetic `mfu_peak_flops` is the peak of: fp64 → fp64 tensor cores, fp32 → fp32 "
         "CUDA cores, tf32 → tf32 tensor cores, fp16-mixed → fp16 tensor cores (autocast), "
         "bf16-mixed and bf16 → bf16 tensor cores."},
        {Kind::attribute, kSummary, "rank_step_imbalance", "", "float", "",
         "(max − min) ÷ mean of the ranks' mean step times (kept for readers of the first schema "
         "revision)."},
        {Kind::attribute, kSummary, "imbalance_median", "", "float", "",
         "Per iteration the ranks' busy time (`step_s` − `comm_wait_s`) max ÷ mean over ranks (1 "
         "= perfectly balanced), then the median over iterations."},
        {Kind::attribute, kSummary, "imbalance_p95", "", "float", "",
         "The same per-iteration imbalance of busy time, 95th percentile over iterations."},
        {Kind::attribute, kSummary, "straggler_ranks", "", "str", "",
         "Comma-separated ranks whose mean busy time (`step_s` − `comm_wait_s`) exceeds the mean "
         "over all ranks by more than `straggler_threshold` (empty when none): in lock-step every "
         "rank's step time is the same, and the straggler is the rank that waits least."},
        {Kind::attribute, kSummary, "straggler_threshold", "", "float", "",
         "The relative excess of mean busy time that makes a straggler (0.05 = 5 %)."},
        {Kind::attribute, kSummary, "energy_j", "", "float", "",
         "GPU energy over the measured iterations, summed over ranks: each rank's telemetry "
         "energy counter (`/telemetry/energy_j`) between the first measured iteration's start and "
         "the last one's end; NaN when a rank has none (no GPU telemetry, telemetry off)."},
        {Kind::attribute, kSummary, "energy_per_iteration_j", "", "float", "",
         "`energy_j` ÷ measured iterations."},
        {Kind::attribute, kSummary, "energy_per_sample_j", "", "float", "",
         "`energy_j` ÷ (measured iterations × global batch)."},
        {Kind::attribute, kSummary, "peak_host_rss_bytes", "", "float", "",
         "Maximum over ranks and iterations of `/iterations/host_peak_rss_bytes`."},
        {Kind::attribute, kSummary, "peak_device_allocated_bytes", "", "float", "",
         "Maximum over ranks and iterations of `/iterations/device_allocated_peak_bytes` (NaN on "
         "CPU runs)."},
        {Kind::attribute, kSummary, "peak_host_tensor_bytes", "", "float", "",
         "Maximum over ranks and iterations of `/iterations/host_tensor_peak_bytes`."},
        {Kind::attribute, kSummary, "epochs_completed", "", "int", "an epoch completed",
         "Epochs completed (the last epoch's index + 1)."},
        {Kind::attribute, kSummary, "final_val_accuracy", "", "float", "an epoch completed",
         "The last epoch's `val_accuracy` (fraction 0–1)."},
        {Kind::attribute, kSummary, "final_val_loss", "", "float", "an epoch completed",
         "The last epoch's `val_loss`."},
        {Kind::attribute, kSummary, "final_val_perplexity", "", "float", "an epoch completed",
         "The last epoch's `val_perplexity`."},
        {Kind::attribute, kSummary, "final_train_loss", "", "float", "an epoch completed",
         "The last epoch's `train_loss`."},
        {Kind::attribute, kSummary, "nonfinite_skipped_steps", "", "int", "",
         "Steps dropped by `run.nonfinite=skip` in this file's iterations."},
        {Kind::attribute, kSummary, "host_syncs_per_iteration", "", "float", "",
         "The harness's device-to-host reads per measured iteration (`/iterations/host_syncs`), "
         "the largest over ranks."},
        {Kind::group, kComm, "", "", "", "",
         "Communication accounting, with nccl-tests' conventions: **algbw** = bytes ÷ time (GB/s, "
         "1 GB = 10^9 B); **busbw** = algbw × a factor that makes figures comparable across rank "
         "counts n: allreduce 2(n−1)/n, allgather and reduce-scatter (n−1)/n, broadcast 1. "
         "`bytes` is the whole array as nccl-tests count it: allreduce and broadcast the buffer, "
         "allgather the gathered output, reduce-scatter the input (all ranks' blocks). The "
         "communication benchmark (`run.workload=comm`, options `comm.*`) writes one group per "
         "operation (`/comm/<op>`) and this group's attributes. The gradient communication of "
         "training runs appears per iteration as `/iterations` columns (`comm_bytes`, "
         "`comm_collective_s`, `comm_wait_s`) and per bucket in `/comm/buckets`. Absent from runs "
         "that have neither."},
        {Kind::attribute, kComm, "backend", "", "str", "run.workload=comm",
         "Communication backend, `mpi` or `nccl`."},
        {Kind::attribute, kComm, "world_size", "", "int", "run.workload=comm",
         "Ranks taking part (n)."},
        {Kind::attribute, kComm, "dtype", "", "str", "run.workload=comm",
         "Element type (`comm.dtype`)."},
        {Kind::attribute, kComm, "warmup", "", "int", "run.workload=comm",
         "Untimed operations per size (`comm.warmup`)."},
        {Kind::attribute, kComm, "iters", "", "int", "run.workload=comm",
         "Timed operations per size (`comm.iters`)."},
        {Kind::attribute, kComm, "time", "", "str", "run.workload=comm",
         "The definition of `time_s` / `time_max_s`, as text."},
        {Kind::attribute, kComm, "bytes", "", "str", "run.workload=comm",
         "The definition of `bytes`, as text."},
        {Kind::series, kCommBuckets, "", "", "", "gradient buckets",
         "Gradient communication per bucket, written by the Recorder like `/iterations` and "
         "flushed with it, in training runs whose gradient synchronizer has buckets: a per-rank "
         "series group [world_size, iterations] with one column per bucket of the rank with the "
         "most buckets (pipeline stages hold different parameters and so different bucket counts; "
         "a rank's extra columns stay NaN), plus the dataset `bytes`."},
        {Kind::attribute, kCommBuckets, "columns", "", "str", "",
         "Column names in the writer's order, comma-separated."},
        {Kind::attribute, kCommBuckets, "rows", "", "int", "",
         "`n`, the second dimension of every dataset in the group; updated at every flush."},
        {Kind::attribute, kCommBuckets, "rank_rows", "", "int64[world_size]", "",
         "Rows rank r actually wrote (≤ `rows`); updated at every flush. Use it, not `isnan`, to "
         "know how many rows each rank really wrote: a rank may also record NaN on purpose (e.g. "
         "no validation loss that epoch)."},
        {Kind::column, kCommBuckets, "bucket_{k}_s", "s", "", "",
         "Bucket k's allreduce (0-based, in launch order) in that iteration: its own duration, "
         "measured on the MPI backend's progress thread or between CUDA events on NCCL's stream."},
        {Kind::vector, kCommBucketsBytes, "", "B", "", "gradient buckets",
         "Payload per bucket in launch order, float64 [buckets] (rank 0's values)."},
        {Kind::group, kCommOp, "", "", "", "run.workload=comm",
         "Communication benchmark results of one operation `<op>` of `comm.ops`: `allreduce`, "
         "`allgather`, `reduce_scatter` or `broadcast`. Sizes run from `comm.min_bytes`, "
         "×`comm.factor`, … ≤ `comm.max_bytes`, rounded down to whole elements (`comm.dtype`), "
         "and for allgather / reduce-scatter to a multiple of n so each rank owns `count / n` "
         "elements; a size with less than one element per rank is skipped. Each operation is "
         "first warmed up at the largest and the smallest size (as nccl-tests do); per size: "
         "`comm.warmup` untimed operations, a barrier, `comm.iters` operations back to back; a "
         "rank's time is its mean per operation; `time_s` is the mean over ranks (nccl-tests' "
         "default), `time_max_s` the slowest rank's. Its datasets are 1-D float64 [sizes], "
         "identical on every rank (rank 0 writes them)."},
        {Kind::attribute, kCommOp, "busbw_factor", "", "float", "run.workload=comm",
         "busbw ÷ algbw for this operation at n ranks: allreduce 2(n−1)/n, allgather and "
         "reduce-scatter (n−1)/n, broadcast 1."},
        {Kind::vector, kCommOpBytes, "", "B", "", "run.workload=comm",
         "Array size, after rounding."},
        {Kind::vector, kCommOpCount, "", "1", "", "run.workload=comm", "Elements of that array."},
        {Kind::vector, kCommOpTimeS, "", "s", "", "run.workload=comm",
         "Seconds per operation, mean over ranks."},
        {Kind::vector, kCommOpTimeMaxS, "", "s", "", "run.workload=comm",
         "The slowest rank's seconds per operation."},
        {Kind::vector, kCommOpAlgbwGBps, "", "GB/s", "", "run.workload=comm",
         "`bytes / time_s / 1e9`."},
        {Kind::vector, kCommOpBusbwGBps, "", "GB/s", "", "run.workload=comm",
         "`algbw_GBps × busbw_factor`."},
        {Kind::series, kTelemetry, "", "", "", "telemetry.enabled=true",
         "Sampled counters, a per-rank series group [world_size, n_sample] written when "
         "`telemetry.enabled=true` (default): a background thread on every rank samples every "
         "`telemetry.interval_ms` (default 500), plus one sample when sampling starts and one "
         "when it stops, so ranks usually hold different row counts (`rank_rows`). GPU counters "
         "come from NVML, loaded at run time; where it is missing (no driver, CPU run) the GPU "
         "columns are NaN and the attributes say why."},
        {Kind::attribute, kTelemetry, "columns", "", "str", "",
         "Column names in the writer's order, comma-separated."},
        {Kind::attribute, kTelemetry, "rows", "", "int", "",
         "`n`, the second dimension of every dataset in the group; updated at every flush."},
        {Kind::attribute, kTelemetry, "rank_rows", "", "int64[world_size]", "",
         "Rows rank r actually wrote (≤ `rows`); updated at every flush. Use it, not `isnan`, to "
         "know how many rows each rank really wrote: a rank may also record NaN on purpose (e.g. "
         "no validation loss that epoch)."},
        {Kind::attribute, kTelemetry, "gpu_available", "", "int", "",
         "1 if every rank sampled its GPU through NVML, else 0."},
        {Kind::attribute, kTelemetry, "gpu_available_ranks", "", "int", "",
         "Number of ranks that did."},
        {Kind::attribute, kTelemetry, "reason", "", "str", "",
         "Why GPU telemetry is missing, for the lowest such rank, e.g. `rank 0: CPU run: no CUDA "
         "device bound to this rank` or `rank 1: libnvidia-ml.so.1 not loadable ...`; empty when "
         "available everywhere."},
        {Kind::attribute, kTelemetry, "interval_ms", "", "int", "", "The sampling period."},
        {Kind::attribute, kTelemetry, "gpu_name", "", "str", "",
         "NVML's name of rank 0's GPU (empty without NVML)."},
        {Kind::attribute, kTelemetry, "nvml_device_match", "", "str", "",
         "How rank 0's GPU was found: `pci_bus_id` (robust to `CUDA_VISIBLE_DEVICES`) or `index`."},
        {Kind::attribute, kTelemetry, "clock", "", "str", "",
         "A reminder of the time base of `t_s`."},
        {Kind::column, kTelemetry, "t_s", "s", "", "",
         "Sample time on the run clock of `/iterations/t_start` (per rank, steady clock)."},
        {Kind::column, kTelemetry, "cpu_percent", "percent", "", "",
         "Process CPU time (user + system) / wall time since the previous sample, in % of one "
         "core (0 .. 100 x cores); NaN for the first sample."},
        {Kind::column, kTelemetry, "rss_bytes", "B", "", "",
         "Resident set size of the rank's process."},
        {Kind::column, kTelemetry, "load1", "1", "", "", "1-minute load average of the node."},
        {Kind::column, kTelemetry, "power_w", "W", "", "",
         "`nvmlDeviceGetPowerUsage`: board power, averaged by the driver (1 s on H100)."},
        {Kind::column, kTelemetry, "power_instant_w", "W", "", "",
         "NVML field 186 (instant power), where the driver offers it."},
        {Kind::column, kTelemetry, "energy_j", "J", "", "",
         "GPU energy counter (`nvmlDeviceGetTotalEnergyConsumption`) minus its value at the "
         "rank's first sample."},
        {Kind::column, kTelemetry, "gpu_util_percent", "percent", "", "",
         "`nvmlDeviceGetUtilizationRates`: time a kernel ran in the driver's last period."},
        {Kind::column, kTelemetry, "mem_util_percent", "percent", "", "",
         "`nvmlDeviceGetUtilizationRates`: time device memory was accessed in the driver's last "
         "period."},
        {Kind::column, kTelemetry, "sm_clock_mhz", "MHz", "", "", "Current SM clock."},
        {Kind::column, kTelemetry, "temperature_c", "degC", "", "", "GPU temperature."},
        {Kind::column, kTelemetry, "gpu_mem_used_bytes", "B", "", "",
         "Device memory in use (all processes on the GPU)."},
        {Kind::column, kTelemetry, "pcie_tx_bytes_per_s", "B/s", "", "",
         "`nvmlDeviceGetPcieThroughput`, transmitted (20 ms window)."},
        {Kind::column, kTelemetry, "pcie_rx_bytes_per_s", "B/s", "", "",
         "`nvmlDeviceGetPcieThroughput`, received (20 ms window)."},
        {Kind::column, kTelemetry, "nvlink_tx_bytes_per_s", "B/s", "", "",
         "NVLink data transmitted over all links between consecutive samples (field 138); NaN for "
         "the first sample."},
        {Kind::column, kTelemetry, "nvlink_rx_bytes_per_s", "B/s", "", "",
         "NVLink data received over all links between consecutive samples (field 139); NaN for "
         "the first sample."},
        {Kind::group, kProfile, "", "", "", "run.workload=cv or llm",
         "The profiler window (`profile.enabled=true`): LibTorch's Kineto profiler records "
         "iterations `profile.start_iter` … `start_iter + profile.iters − 1` (0-based, counted "
         "over all epochs), each inside a `ProfilerStep#<iteration>` user scope, with CPU "
         "activities (+ CUDA, and CUDA synchronization events, on GPU runs). Only the thread "
         "running the training loop (and autograd's device threads) is profiled: the data "
         "loader's worker threads are not. Per-rank summaries of the window: per-rank values, "
         "per-rank tables and the HTA breakdown. A run without the window has only the attribute "
         "`/profile@enabled = 0`."},
        {Kind::attribute, kProfile, "enabled", "", "int", "",
         "1 with the profiler window (`profile.enabled`), else 0."},
        {Kind::attribute, kProfile, "start_iter", "", "int", "profile.enabled=true",
         "`profile.start_iter`: the window's first iteration."},
        {Kind::attribute, kProfile, "iters", "", "int", "profile.enabled=true",
         "`profile.iters`: iterations in the window."},
        {Kind::attribute, kProfile, "top_n", "", "int", "profile.enabled=true",
         "`profile.top_n`: rows of `top_ops` and `top_kernels`."},
        {Kind::attribute, kProfile, "trace", "", "int", "profile.enabled=true",
         "1 when Chrome traces were written (`profile.trace`), else 0."},
        {Kind::attribute, kProfile, "status", "", "str", "profile.enabled=true",
         "`complete`; `incomplete`: the run ended inside the window; `not_reached`: it ended "
         "before `start_iter` (rank 0's)."},
        {Kind::attribute, kProfile, "first_iteration", "", "int", "profile.enabled=true",
         "The first iteration profiled, −1 when the window was not reached."},
        {Kind::attribute, kProfile, "trace_files", "", "str", "profile.enabled=true",
         "JSON list of the ranks' Chrome traces, `[]` without `profile.trace`; each is `<run file "
         "stem>.rank<R>.trace.json` beside the run file, with `distributedInfo` metadata "
         "`{\"backend\": ..., \"rank\": R, \"world_size\": W}` for HTA and Perfetto."},
        {Kind::attribute, kProfile, "threads", "", "str", "profile.enabled=true",
         "Which threads were profiled, as text."},
        {Kind::per_rank, kProfileWindowS, "", "s", "", "profile.enabled=true",
         "Host wall time from enabling to disabling the profiler (NaN when not reached). Per-rank "
         "values are float64 [world_size], element r = rank r."},
        {Kind::per_rank, kProfileIterations, "", "iterations", "", "profile.enabled=true",
         "Iterations inside the window on that rank."},
        {Kind::per_rank, kProfileHostSyncCalls, "", "calls", "", "profile.enabled=true",
         "CUDA runtime calls in the window that blocked the host until the device caught up "
         "(`cudaStreamSynchronize`, `cudaDeviceSynchronize`, `cudaEventSynchronize`, synchronous "
         "`cudaMemcpy*`/`cudaMemset*`; `.item()` counts once); ÷ `iterations` gives the "
         "profiler's synchronisations per iteration, to compare with `/iterations/host_syncs` "
         "(the harness's own reads). 0 on CPU runs."},
        {Kind::table, kProfileCategories, "", "", "", "profile.enabled=true",
         "A per-rank table in the variable-length layout: one global 1-D dataset per column "
         "holding the ranks' rows back to back in rank order, plus two int64 [world_size] indexes "
         "`<column>_offset` and `<column>_count` (units `1`): rank r's values are `X[X_offset[r] "
         ": X_offset[r] + X_count[r]]`. The `name` column is fixed-length UTF-8 strings "
         "NUL-padded to the longest name (h5py: `ds.asstr()[...]`), units `text`. One row per "
         "category, sorted by name. Categories: `cpu_op` (every CPU operator, inclusive: nested "
         "operators also count in their parents), `cpu_op_top_level` (operators not nested in "
         "another one on their thread: their total fits in `window_s`), `profiler_step` (the "
         "window's iterations), `user_annotation`, `gpu_kernel`, `nccl_kernel`, `memcpy_htod`, "
         "`memcpy_dtoh`, `memcpy_dtod`, `memcpy_other`, `memset`, `cuda_runtime:<call>` (e.g. "
         "`cuda_runtime:cudaLaunchKernel`, `cuda_runtime:cudaMemcpyAsync`, "
         "`cuda_runtime:cudaStreamSynchronize`), `cuda_driver:<call>`, `cuda_sync`. On CPU runs "
         "only the operator categories appear."},
        {Kind::column, kProfileCategories, "name", "text", "", "", "The category."},
        {Kind::column, kProfileCategories, "count", "events", "", "",
         "Events of the category in the window."},
        {Kind::column, kProfileCategories, "total_s", "s", "", "",
         "Their total duration (operators: inclusive)."},
        {Kind::column, kProfileCategories, "min_s", "s", "", "", "The shortest event."},
        {Kind::column, kProfileCategories, "max_s", "s", "", "", "The longest event."},
        {Kind::table, kProfileTopOps, "", "", "", "profile.enabled=true",
         "A per-rank table in the variable-length layout: one global 1-D dataset per column "
         "holding the ranks' rows back to back in rank order, plus two int64 [world_size] indexes "
         "`<column>_offset` and `<column>_count` (units `1`): rank r's values are `X[X_offset[r] "
         ": X_offset[r] + X_count[r]]`. The `name` column is fixed-length UTF-8 strings "
         "NUL-padded to the longest name (h5py: `ds.asstr()[...]`), units `text`. The "
         "`profile.top_n` CPU operators with the largest total time, descending. Convolutions "
         "appear as `aten::convolution` (forward), `ConvolutionBackward0` (autograd node) and "
         "`aten::convolution_backward`."},
        {Kind::column, kProfileTopOps, "name", "text", "", "",
         "The operator, e.g. `aten::convolution`."},
        {Kind::column, kProfileTopOps, "count", "events", "", "", "Calls in the window."},
        {Kind::column, kProfileTopOps, "total_s", "s", "", "",
         "Total time, inclusive of nested operators."},
        {Kind::column, kProfileTopOps, "self_s", "s", "", "",
         "Total time excluding directly nested operators."},
        {Kind::table, kProfileTopKernels, "", "", "", "profile.enabled=true",
         "A per-rank table in the variable-length layout: one global 1-D dataset per column "
         "holding the ranks' rows back to back in rank order, plus two int64 [world_size] indexes "
         "`<column>_offset` and `<column>_count` (units `1`): rank r's values are `X[X_offset[r] "
         ": X_offset[r] + X_count[r]]`. The `name` column is fixed-length UTF-8 strings "
         "NUL-padded to the longest name (h5py: `ds.asstr()[...]`), units `text`. The "
         "`profile.top_n` GPU kernels (NCCL's too) with the largest total time."},
        {Kind::column, kProfileTopKernels, "name", "text", "", "", "The kernel."},
        {Kind::column, kProfileTopKernels, "count", "events", "", "", "Launches in the window."},
        {Kind::column, kProfileTopKernels, "total_s", "s", "", "", "Total time."},
        {Kind::group, kProfileBreakdown, "", "", "", "profile.enabled=true",
         "The window's temporal breakdown per rank, following Holistic Trace Analysis: kernel "
         "classes communication (`^nccl` or contains `ncclKernel`), memory (memcpy, memset, names "
         "with `Memcpy`/`Memset`/`dma`), compute (the rest); HTA's \"non-compute\" is "
         "`communication_s + memory_s`. Without GPU kernels (CPU runs) every time is NaN, never "
         "zero. Per-rank values, float64 [world_size] (element r = rank r)."},
        {Kind::attribute, kProfileBreakdown, "gpu_kernels", "", "int", "",
         "Rank 0's count of GPU kernels in the window (per rank: the dataset `gpu_kernels`)."},
        {Kind::attribute, kProfileBreakdown, "definition", "", "str", "",
         "The breakdown's definition, as text."},
        {Kind::per_rank, kProfileBreakdownGpuKernels, "", "kernels", "", "profile.enabled=true",
         "GPU kernels in the window (0 on CPU runs)."},
        {Kind::per_rank, kProfileBreakdownComputeS, "", "s", "", "profile.enabled=true",
         "Time at least one compute kernel ran."},
        {Kind::per_rank, kProfileBreakdownCommunicationS, "", "s", "", "profile.enabled=true",
         "Time a communication (NCCL) kernel ran and no compute kernel."},
        {Kind::per_rank, kProfileBreakdownMemoryS, "", "s", "", "profile.enabled=true",
         "Time only memcpy/memset ran."},
        {Kind::per_rank, kProfileBreakdownIdleS, "", "s", "", "profile.enabled=true",
         "Time no device activity ran, inside the span."},
        {Kind::per_rank, kProfileBreakdownSpanS, "", "s", "", "profile.enabled=true",
         "Last device end − first device start; compute, communication, memory and idle add up to "
         "it."},
        {Kind::per_rank, kProfileBreakdownOverlapRatio, "", "1", "", "profile.enabled=true",
         "Time computing while communicating ÷ time communicating (NaN without communication)."},
    };
    return t;
}

} // namespace trainscope::io::schema
