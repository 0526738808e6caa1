/* trainrun/config_schema.h: the job-config schema, one line per key.
 *
 * This table is the single source of the job config: the typed struct
 * tr_config_t, the defaults, the type and range checks, the TOML and JSON
 * printers and the man page trainrun.toml(5) are all generated from it, so
 * they cannot drift. Section and key names and defaults follow torchtitan's
 * JobConfig (TOML era); keys marked "trainrun:" in their description are
 * trainrun's own.
 *
 * TR_CONFIG_SECTIONS(S) lists the sections: S(section, "description").
 * TR_CONFIG_KEYS_<section>(X) lists a section's keys:
 *
 *   X(section, key, TYPE, "default", min, max, "choices", "description")
 *
 * TYPE is one of
 *   INT        int64_t; min/max bound it (inclusive)
 *   FLOAT      double; min/max bound it (inclusive); TOML integers accepted
 *   BOOL       bool
 *   STR        char* (never NULL)
 *   ENUM       char*, one of "choices" ("a|b|c"; matched ignoring case and
 *              stored as spelled in choices)
 *   LIST       tr_config_list_t, a list of strings (CLI: a comma list)
 *   OPT_INT    tr_config_opt_int_t: unset (torchtitan's None) or an int
 *   OPT_FLOAT  tr_config_opt_float_t: unset or a double
 *   OPT_STR    char*, NULL when unset
 *   SECRET     char*, NULL when unset; never printed
 * "default" is the value as it would be written on the command line (NULL
 * for unset). TR_CFG_NOMIN / TR_CFG_NOMAX mean unbounded.
 *
 * To add a key: add one X line to its section (and, if it needs a check that
 * involves other keys, a line in tr_config_resolve). Then run
 * `make update-man-config` to regenerate man/trainrun.toml.5.
 */
#ifndef TRAINRUN_CONFIG_SCHEMA_H
#define TRAINRUN_CONFIG_SCHEMA_H

#include <math.h>

#define TR_CFG_NOMIN (-HUGE_VAL)
#define TR_CFG_NOMAX (HUGE_VAL)

/* clang-format off */
#define TR_CONFIG_SECTIONS(S)                                                  \
  S(job, "where the job writes its outputs and how it is named")              \
  S(model, "which model family and size to train")                            \
  S(training, "data, batch sizes, steps, precision and device")               \
  S(parallelism, "how the world of ranks is split into parallel dimensions")  \
  S(checkpoint, "saving and loading checkpoints")                             \
  S(optimizer, "the optimizer")                                               \
  S(lr_scheduler, "learning-rate warmup and decay")                           \
  S(metrics, "what is logged, how often and where")                           \
  S(comm, "process groups, timeouts, the store and the flight recorder")      \
  S(activation_checkpoint, "recomputing activations to save memory")          \
  S(validation, "evaluation on held-out data during training")                \
  S(debug, "seeds, determinism and fault injection")

#define TR_CONFIG_KEYS_job(X)                                                  \
  X(job, config_file, OPT_STR, NULL, 0, 0, NULL,                               \
    "Path of the job file; set from the command line (the JOB.toml argument "  \
    "or --job.config_file). In a file it is informational.")                   \
  X(job, dump_folder, STR, "./outputs", 0, 0, NULL,                            \
    "Folder for everything the job writes: checkpoints, metrics, "             \
    "TensorBoard events, flight-recorder dumps.")                              \
  X(job, description, STR, "default job", 0, 0, NULL,                         \
    "A name for the job, shown in logs.")                                      \
  X(job, print_config, BOOL, "false", 0, 0, NULL,                              \
    "Print the resolved config at start.")                                     \
  X(job, save_config_file, OPT_STR, NULL, 0, 0, NULL,                          \
    "If set, rank 0 writes the resolved config as TOML (what trainrun "        \
    "config prints; a secret key is left out) to this file inside "            \
    "dump_folder at start.")                                                   \
  X(job, custom_config_module, STR, "", 0, 0, NULL,                            \
    "Accepted so torchtitan job files load; trainrun has no Python config "    \
    "modules and must leave it empty.")

#define TR_CONFIG_KEYS_model(X)                                                \
  X(model, name, ENUM, "llama3", 0, 0, "llama3|gpt2",                          \
    "Model family.")                                                           \
  X(model, flavor, STR, "debugmodel", 0, 0, NULL,                              \
    "Model size within the family: debugmodel, and for llama3 1B, 3B, 8B, "   \
    "70B; for gpt2 124M, 350M, 774M, 1558M.")                                  \
  X(model, hf_assets_path, STR, "./tests/assets/tokenizer", 0, 0, NULL,        \
    "Folder with Hugging Face assets (tokenizer, config). Accepted so "        \
    "torchtitan job files load: trainrun reads no assets (its tokenizer is "   \
    "byte-level, token shards come tokenized, and config.json is written "     \
    "from the model config). Another value than the default logs a note "      \
    "that it changes nothing.")                                                \
  X(model, converters, LIST, "", 0, 0, NULL,                                   \
    "Model converters applied after building the model (torchtitan: "         \
    "float8, mx); none are implemented by trainrun yet.")                      \
  X(model, print_after_conversion, BOOL, "false", 0, 0, NULL,                  \
    "Print the parameter table (name, shape, elements) at start; trainrun "    \
    "has no converters, so it is the model as built.")                         \
  X(model, attn_mask_type, ENUM, "causal", 0, 0, "causal|block_causal",        \
    "Attention mask (torchtitan's name). causal: every token sees all "        \
    "earlier tokens of its row. block_causal: documents packed in a row are "  \
    "kept apart -- a document ends with (and includes) each eos_id token, "    \
    "and a token sees only the earlier tokens of its own document "            \
    "(torchtitan's get_document_mask_mod). On GPUs block_causal runs on "     \
    "cuDNN's fused attention when it applies (each document a sequence of "   \
    "a ragged graph; cuDNN 9.6 or later), else on the flash or SIMT kernel; " \
    "attention with a sliding_window, and under context parallelism a "      \
    "query chunk's documents over an earlier key chunk, run on the flash or " \
    "SIMT kernel (TRAINRUN_ATTENTION=cudnn is refused with a "                \
    "sliding_window, and with block_causal under context parallelism or "     \
    "with attention heads per rank not a multiple of 4; under it a batch "    \
    "whose documents cuDNN declines ends the run).")                          \
  X(model, eos_id, OPT_INT, NULL, 0, 2147483647, NULL,                         \
    "trainrun: the end-of-text token that ends a document under "              \
    "block_causal. Unset: the model's -- gpt2 50256 (<|endoftext|>), llama3 "  \
    "128001 (<|end_of_text|>), the debugmodel flavors 0 (the byte "            \
    "tokenizer's EOT, which trainrun's data put before every text file). "     \
    "Must be below the vocabulary size; refused with causal masks.")           \
  X(model, sliding_window, INT, "0", 0, TR_CFG_NOMAX, NULL,                    \
    "trainrun: sliding-window attention (Hugging Face's name): each token "    \
    "sees at most this many most recent tokens, itself included "              \
    "(torchtitan's get_sliding_window_mask_mod, q - k < W); combines with "    \
    "block_causal. 0: no window. A window longer than training.seq_len is "    \
    "refused.")                                                                \
  X(model, document_positions, BOOL, "false", 0, 0, NULL,                      \
    "trainrun: positions restart at 0 at each document start (GPT-2's "        \
    "position embedding row, Llama's RoPE angle), so a packed document is "    \
    "computed as if it stood alone. Needs attn_mask_type = "                   \
    "\"block_causal\". RoPE depends only on the distance between positions, "  \
    "so for llama3 it changes the rounding only.")

#define TR_CONFIG_KEYS_training(X)                                             \
  X(training, dataset, STR, "c4_test", 0, 0, NULL,                             \
    "Name of the dataset; used when dataset_path is unset.")                   \
  X(training, dataset_path, OPT_STR, NULL, 0, 0, NULL,                         \
    "Training data: a text file (byte-level tokens) or llm.c token shards "   \
    "(a .bin file, a folder or a glob).")                                      \
  X(training, local_batch_size, INT, "8", 1, TR_CFG_NOMAX, NULL,               \
    "Sequences per rank per micro-step.")                                      \
  X(training, global_batch_size, INT, "-1", -1, TR_CFG_NOMAX, NULL,            \
    "Sequences per optimizer step over all ranks; -1 means local_batch_size " \
    "times the data-parallel degree. A multiple of that turns on gradient "    \
    "accumulation.")                                                           \
  X(training, seq_len, INT, "2048", 1, TR_CFG_NOMAX, NULL,                     \
    "Tokens per sequence.")                                                    \
  X(training, max_norm, FLOAT, "1.0", 0, TR_CFG_NOMAX, NULL,                   \
    "Clip the global gradient norm to this value; 0 turns clipping off.")      \
  X(training, steps, INT, "10000", 1, TR_CFG_NOMAX, NULL,                      \
    "Optimizer steps to train.")                                               \
  X(training, enable_cpu_offload, BOOL, "false", 0, 0, NULL,                   \
    "FSDP CPU offload (shards, gradients and optimizer state in pinned host "  \
    "memory, the optimizer step on the CPU): not implemented, true is "        \
    "refused.")                                                                \
  X(training, dtype, ENUM, "float32", 0, 0, "float32|bfloat16",                \
    "Dtype of the parameters when FSDP mixed precision is not in use: "        \
    "float32 (trainrun keeps float32 master weights); bfloat16 is refused, "   \
    "use mixed_precision_param.")                                              \
  X(training, mixed_precision_param, ENUM, "bfloat16", 0, 0,                   \
    "bfloat16|float32",                                                        \
    "Dtype of parameters and compute under FSDP (master weights stay "        \
    "float32). Ignored on CPU, which computes in float32.")                    \
  X(training, mixed_precision_reduce, ENUM, "float32", 0, 0,                   \
    "float32|bfloat16", "Dtype of gradient reduce-scatters under FSDP.")       \
  X(training, gc_freq, INT, "50", 1, TR_CFG_NOMAX, NULL,                       \
    "Accepted so torchtitan job files load (Python garbage collection). "      \
    "Another value than the default logs a note that it changes nothing.")     \
  X(training, device, ENUM, "auto", 0, 0, "auto|cpu|cuda",                     \
    "trainrun: where each rank computes; auto means cuda when the build has " \
    "CUDA and a GPU is visible, else cpu.")

#define TR_CONFIG_KEYS_parallelism(X)                                          \
  X(parallelism, data_parallel_replicate_degree, INT, "1", 1, TR_CFG_NOMAX,    \
    NULL, "Replicas of the model (DDP; HSDP when data_parallel_shard_degree " \
    "> 1 too).")                                                               \
  X(parallelism, data_parallel_shard_degree, INT, "-1", -1, TR_CFG_NOMAX,      \
    NULL, "Ranks each model replica is sharded over (FSDP); -1 takes the "    \
    "ranks the other degrees leave.")                                          \
  X(parallelism, fsdp_reshard_after_forward, ENUM, "default", 0, 0,            \
    "default|always|never",                                                    \
    "Free gathered parameters after forward (always), keep them for "          \
    "backward (never), or always except under pipeline parallelism "           \
    "(default). Under pipeline parallelism a stage's groups are gathered "     \
    "at their first use in a step and, with default or never, held through "   \
    "its micro-batches (the rank's stages' parameters and fp32 gradients "     \
    "held unsharded for the step); always frees them after each forward "      \
    "and gathers them again in the backward. Either way their gradients "      \
    "accumulate unsharded and are reduce-scattered once, after the stage's "   \
    "last backward.")                                                          \
  X(parallelism, fsdp_prefetch_depth, INT, "1", 0, 64, NULL,                   \
    "trainrun: FSDP groups whose all-gathers are issued ahead of the one "     \
    "about to compute, forward and backward: 1 is FSDP2's implicit "           \
    "prefetch (the next block), k > 1 its explicit set_modules_to_forward_"    \
    "prefetch / set_modules_to_backward_prefetch with k blocks (more "         \
    "overlap, k more unsharded groups held), 0 gathers each group only "       \
    "when it is used. The losses are the same for every depth.")               \
  X(parallelism, tensor_parallel_degree, INT, "1", 1, TR_CFG_NOMAX, NULL,      \
    "Ranks each layer's matrices are split over (Megatron-style tensor "       \
    "parallel, torchtitan's plan, the innermost mesh dim: neighbouring "       \
    "ranks): q, k, v and the MLP's first matrices (GPT-2: c_attn, c_fc) "      \
    "split by output rows, the attention output and MLP projections "          \
    "(c_proj) by input columns, heads and KV heads split across the "          \
    "ranks; the token embedding and the output projection split over the "     \
    "vocabulary when the degree divides it (loss parallel); sequence "         \
    "parallel: the residual stream, norms and residual adds on sequence "      \
    "shards, an all-gather before each column-parallel input and a "           \
    "reduce-scatter after each row-parallel output. It must divide the "       \
    "attention heads, the KV heads, the FFN width and seq_len. The tp "        \
    "ranks of a replica read the same samples. Composes with "                 \
    "data_parallel_replicate_degree (DDP), data_parallel_shard_degree "        \
    "(FSDP, HSDP; GPT-2's FSDP shards of a rank's q|k|v rows of c_attn "       \
    "may straddle q and k or k and v, as PyTorch's _StridedShard) and "        \
    "pipeline_parallel_degree. Its checkpoints load into any other "           \
    "layout.")                                                                 \
  X(parallelism, disable_loss_parallel, BOOL, "false", 0, 0, NULL,             \
    "Under tensor parallelism, gather the logit slices of the tp ranks "       \
    "and compute the ordinary cross-entropy, instead of the "                  \
    "vocabulary-sharded one (loss parallel: max, sum of exponentials and "     \
    "target logit reduced over tp, no [B, T, V] logits on any rank). The "     \
    "losses are the same. It acts where tensor_parallel_degree divides "       \
    "the vocabulary (else the output projection stays whole on every "         \
    "rank); on CUDA devices it is refused (the logit gather is built for "     \
    "the CPU only).")                                                          \
  X(parallelism, enable_async_tensor_parallel, BOOL, "false", 0, 0, NULL,      \
    "Overlap tensor parallelism's communication with its matmuls "             \
    "(torchtitan's async TP, without a compiler): the sequence-parallel "      \
    "all-gather before the column-parallel linears and the reduce-scatter "    \
    "after the row-parallel ones, forward and backward, are cut into one "     \
    "chunk of T/tp rows per tp rank and passed around a ring of "              \
    "point-to-point transfers while the GEMM of the chunk a rank holds "       \
    "runs (on Gloo the host computes while the group's thread moves bytes; "   \
    "on NCCL the compute stream waits for a transfer only before it needs "    \
    "it). The results equal the blocking collectives' within rounding (the "   \
    "reduce-scatter's sums are added in ring order). Needs "                   \
    "tensor_parallel_degree above 1 (sequence parallel is always on with "     \
    "it); [metrics] comm_overlap reports the ring's steps as the tp "          \
    "communication and how much of it the GEMMs hid.")                         \
  X(parallelism, pipeline_parallel_degree, INT, "1", 1, TR_CFG_NOMAX, NULL,    \
    "Pipeline ranks the layers are split over (the outermost mesh dim): "      \
    "stages of consecutive blocks (torchtitan's split: the embedding on "      \
    "the first stage, the final norm, output and loss on the last), "          \
    "activations and their gradients sent between ranks, each rank holding "   \
    "only its stages' parameters; a table tied between the embedding and "     \
    "the output lives on both end stages. Composes with "                      \
    "tensor_parallel_degree, data_parallel_shard_degree (FSDP, HSDP: each "    \
    "stage's blocks sharded over its dp_shard ranks, gathered once a step "    \
    "and reduce-scattered once) and data_parallel_replicate_degree alone "     \
    "(DDP: the gradients all-reduced once after the schedule). Validation "    \
    "runs its batches forward only through the stages.")                       \
  X(parallelism, pipeline_parallel_schedule, ENUM, "1F1B", 0, 0,               \
    "1F1B|GPipe|Interleaved1F1B|LoopedBFS|InterleavedZeroBubble|"              \
    "ZBVZeroBubble|DualPipeV",                                                 \
    "Pipeline schedule, PyTorch's classes: GPipe and 1F1B run one stage a "    \
    "rank; Interleaved1F1B, LoopedBFS and InterleavedZeroBubble several, "     \
    "looped (stage s on rank s % pp); ZBVZeroBubble and DualPipeV two, in "    \
    "a V (rank r holds stages r and 2pp - 1 - r). The zero-bubble ones "       \
    "split the backward into input and weight gradients. Their action "        \
    "lists equal PyTorch 2.11's.")                                             \
  X(parallelism, pipeline_parallel_schedule_csv, STR, "", 0, 0, NULL,          \
    "A CSV file with an explicit compute-only pipeline schedule in "           \
    "PyTorch's format (a row per rank, a cell per action like 0F1, empty "     \
    "cells idle), used instead of the schedule's generator; "                  \
    "pipeline_parallel_schedule still sets the stages per rank and their "     \
    "placement. Checked (actions, each stage on one rank, forwards before "    \
    "backwards, deadlocks) before any worker starts.")                         \
  X(parallelism, pipeline_parallel_microbatch_size, INT, "1", 1,               \
    TR_CFG_NOMAX, NULL,                                                        \
    "Sequences per pipeline micro-batch; must divide local_batch_size (and "   \
    "validation.local_batch_size when validation is on). A step runs "         \
    "local_batch_size / this micro-batches times the gradient accumulation "   \
    "steps through one schedule.")                                             \
  X(parallelism, pipeline_parallel_layers_per_stage, OPT_INT, NULL, 1,         \
    TR_CFG_NOMAX, NULL,                                                        \
    "Transformer blocks per stage (the embedding and the output each "         \
    "weigh first_stage_less_layers and last_stage_less_layers blocks); "       \
    "sets the stages per rank. Unset: one stage a rank for GPipe and "         \
    "1F1B, two for the others, the blocks split evenly.")                      \
  X(parallelism, pipeline_parallel_first_stage_less_layers, INT, "1", 0,       \
    TR_CFG_NOMAX, NULL,                                                        \
    "Blocks fewer on the first stage, which also holds the embedding.")        \
  X(parallelism, pipeline_parallel_last_stage_less_layers, INT, "1", 0,        \
    TR_CFG_NOMAX, NULL,                                                        \
    "Blocks fewer on the last stage, which also holds the final norm, the "    \
    "output projection and the loss.")                                         \
  X(parallelism, context_parallel_degree, INT, "1", 1, TR_CFG_NOMAX, NULL,     \
    "Ranks each sequence is split over (context parallel): 2N chunks, rank "   \
    "r keeps chunks r and 2N-1-r of every sequence; attention sees every "     \
    "key/value chunk through a ring (rotate method), merged with the "        \
    "log-sum-exp; positions are the whole sequence's; FSDP shards over "      \
    "data_parallel_shard_degree x this (even when that is 1), losses and "   \
    "token counts are summed over both. seq_len must be a multiple of 2N. "   \
    "CPU and CUDA; with pipeline parallelism the stages pass "  \
    "the chunks on.")                                                        \
  X(parallelism, context_parallel_load_balancer, ENUM, "headtail", 0, 0,       \
    "headtail|ptrr",                                                           \
    "How sequence chunks are assigned to context-parallel ranks: headtail "   \
    "(rank r: chunks r and 2N-1-r, equal causal work). ptrr (FlexAttention's "\
    "per-document round robin) is refused.")                                  \
  X(parallelism, context_parallel_rotate_method, ENUM, "allgather", 0, 0,      \
    "allgather|alltoall",                                                      \
    "How context-parallel ranks exchange key/value chunks: allgather "        \
    "(gather every chunk, reduce-scatter their gradients back) or alltoall "  \
    "(the chunk pairs rotate around the ring with send/recv, their "          \
    "gradients with them; a rank never holds them all). With "                \
    "context_parallel_degree 1 another value logs a note that it changes "   \
    "nothing.")                                                                \
  X(parallelism, expert_parallel_degree, INT, "1", 1, TR_CFG_NOMAX, NULL,      \
    "Ranks the experts of mixture-of-experts layers are split over: "          \
    "trainrun's models have none, above 1 is refused.")                        \
  X(parallelism, expert_tensor_parallel_degree, INT, "1", 1, TR_CFG_NOMAX,     \
    NULL,                                                                      \
    "Tensor-parallel degree inside experts: 1 or tensor_parallel_degree (no "  \
    "expert parallelism in trainrun). Another value than the default logs a "  \
    "note that it changes nothing.")                                           \
  X(parallelism, expert_parallel_comm_backend, ENUM, "standard", 0, 0,         \
    "standard|deepep",                                                         \
    "All-to-all implementation for expert parallelism (none in trainrun). "    \
    "Another value than the default logs a note that it changes nothing.")

#define TR_CONFIG_KEYS_checkpoint(X)                                           \
  X(checkpoint, enable, BOOL, "false", 0, 0, NULL,                             \
    "Save checkpoints, and resume from the latest complete one at start.")     \
  X(checkpoint, folder, STR, "checkpoint", 0, 0, NULL,                         \
    "Checkpoint folder inside dump_folder; it holds step-N folders.")          \
  X(checkpoint, interval, INT, "500", 1, TR_CFG_NOMAX, NULL,                   \
    "Save every this many steps (and after the last step).")                   \
  X(checkpoint, initial_load_path, OPT_STR, NULL, 0, 0, NULL,                  \
    "A checkpoint step folder to start from when folder holds none.")          \
  X(checkpoint, initial_load_model_only, BOOL, "true", 0, 0, NULL,             \
    "Load only the model weights from initial_load_path.")                     \
  X(checkpoint, initial_load_in_hf, BOOL, "false", 0, 0, NULL,                 \
    "initial_load_path holds Hugging Face safetensors.")                       \
  X(checkpoint, last_save_model_only, BOOL, "true", 0, 0, NULL,                \
    "The save after the last step holds only the model, in export_dtype.")     \
  X(checkpoint, last_save_in_hf, BOOL, "false", 0, 0, NULL,                    \
    "Also write the last save (model only: needs last_save_model_only) as "    \
    "Hugging Face safetensors in its step folder, consolidated from any "      \
    "layout: model-00001-of-0000N.safetensors, "                               \
    "model.safetensors.index.json (written last) and config.json.")            \
  X(checkpoint, export_dtype, ENUM, "float32", 0, 0,                           \
    "float32|bfloat16|float16", "Dtype of model-only saves.")                  \
  X(checkpoint, async_mode, ENUM, "disabled", 0, 0,                            \
    "disabled|async|async_with_pinned_mem",                                    \
    "disabled writes before training continues. async copies the state to "  \
    "host buffers (allocated at start, reused) and writes it from there in "  \
    "the background; the next optimizer step waits only for the copies, "     \
    "never for the write. async_with_pinned_mem: the buffers are page-locked " \
    "and a GPU's tensors are copied on a stream of their own while the next " \
    "step computes (its update waits for them on the GPU). Each save's "      \
    "stall, its real cost to training, is printed and recorded as "           \
    "checkpoint_stall_s.")                                                    \
  X(checkpoint, keep_latest_k, INT, "10", 0, TR_CFG_NOMAX, NULL,               \
    "Keep this many newest complete checkpoints; 0 keeps all. 1 is not "      \
    "allowed (a save in progress could leave none). trainrun: the purge also " \
    "removes incomplete step folders (no metadata.json: a save that never "    \
    "finished) older than the step just saved, with a warning.")               \
  X(checkpoint, load_step, INT, "-1", -1, TR_CFG_NOMAX, NULL,                  \
    "Step to resume from; -1 means the latest complete one.")                  \
  X(checkpoint, exclude_from_loading, LIST, "", 0, 0, NULL,                    \
    "Parts not to load: model, optimizer, lr_scheduler, dataloader, "         \
    "train_state.")                                                            \
  X(checkpoint, enable_first_step_checkpoint, BOOL, "false", 0, 0, NULL,       \
    "Also save after the first step.")                                         \
  X(checkpoint, create_seed_checkpoint, BOOL, "false", 0, 0, NULL,             \
    "Initialise the model, save it as step 0 and exit (one rank).")            \
  X(checkpoint, load_only, BOOL, "false", 0, 0, NULL,                          \
    "Load checkpoints but never save.")                                        \
  X(checkpoint, enable_ft_dataloader_checkpoints, BOOL, "true", 0, 0, NULL,    \
    "Accepted so torchtitan job files load (TorchFT). Another value than "     \
    "the default logs a note that it changes nothing.")

#define TR_CONFIG_KEYS_optimizer(X)                                            \
  X(optimizer, name, ENUM, "AdamW", 0, 0, "AdamW|Adam",                        \
    "Optimizer; Adam applies weight_decay as L2, AdamW decoupled.")            \
  X(optimizer, lr, FLOAT, "8e-4", 0, TR_CFG_NOMAX, NULL,                       \
    "Peak learning rate.")                                                     \
  X(optimizer, beta1, FLOAT, "0.9", 0, 1, NULL, "Adam beta1.")                 \
  X(optimizer, beta2, FLOAT, "0.95", 0, 1, NULL, "Adam beta2.")                \
  X(optimizer, eps, FLOAT, "1e-8", 0, TR_CFG_NOMAX, NULL, "Adam epsilon.")     \
  X(optimizer, weight_decay, FLOAT, "0.1", 0, TR_CFG_NOMAX, NULL,              \
    "Weight decay, applied to matrices and embeddings only (as llm.c, "       \
    "nanoGPT and Hugging Face's Trainer do); norm weights and biases are "    \
    "not decayed. torchtitan decays every parameter.")                        \
  X(optimizer, implementation, ENUM, "fused", 0, 0, "for-loop|foreach|fused",  \
    "Update kernel in PyTorch: one per tensor (for-loop, foreach) or one "     \
    "multi-tensor kernel (fused), all with the same results. trainrun has "    \
    "one AdamW update, fused over each flat parameter buffer, and every "      \
    "choice runs it. Another value than the default logs a note that it "      \
    "changes nothing.")                                                        \
  X(optimizer, early_step_in_backward, BOOL, "false", 0, 0, NULL,              \
    "Step each parameter as soon as its gradient is ready: not implemented "   \
    "(trainrun steps after the gradient sync and clipping), true is "          \
    "refused.")

#define TR_CONFIG_KEYS_lr_scheduler(X)                                         \
  X(lr_scheduler, warmup_steps, INT, "200", 0, TR_CFG_NOMAX, NULL,             \
    "Steps of linear warmup from near 0 to optimizer.lr.")                     \
  X(lr_scheduler, total_steps, OPT_INT, NULL, 1, TR_CFG_NOMAX, NULL,           \
    "Length of the schedule; unset means training.steps.")                     \
  X(lr_scheduler, decay_ratio, OPT_FLOAT, NULL, 0, 1, NULL,                    \
    "Fraction of total_steps spent decaying at the end (warmup-stable-decay); " \
    "unset decays over every step after warmup.")                              \
  X(lr_scheduler, decay_type, ENUM, "linear", 0, 0, "linear|sqrt|cosine",      \
    "Shape of the decay.")                                                     \
  X(lr_scheduler, min_lr_factor, FLOAT, "0.0", 0, 1, NULL,                     \
    "The decay ends at optimizer.lr times this factor.")

#define TR_CONFIG_KEYS_metrics(X)                                              \
  X(metrics, log_freq, INT, "10", 1, TR_CFG_NOMAX, NULL,                       \
    "Print and record metrics every this many steps.")                         \
  X(metrics, enable_tensorboard, BOOL, "false", 0, 0, NULL,                    \
    "Write TensorBoard event files.")                                          \
  X(metrics, save_tb_folder, STR, "tb", 0, 0, NULL,                            \
    "TensorBoard folder inside dump_folder.")                                  \
  X(metrics, enable_wandb, BOOL, "false", 0, 0, NULL,                          \
    "Weights & Biases logging: not available in trainrun; must stay false.")   \
  X(metrics, disable_color_printing, BOOL, "false", 0, 0, NULL,                \
    "Print the step lines without colors.")                                    \
  X(metrics, save_for_all_ranks, BOOL, "false", 0, 0, NULL,                    \
    "Every rank writes metric files, not only the logging rank.")              \
  X(metrics, enable_jsonl, BOOL, "true", 0, 0, NULL,                           \
    "trainrun: write one JSON object per logged step.")                        \
  X(metrics, save_jsonl_file, STR, "metrics.jsonl", 0, 0, NULL,                \
    "trainrun: JSONL file inside dump_folder.")                                \
  X(metrics, comm_overlap, BOOL, "false", 0, 0, NULL,                          \
    "trainrun: time FSDP's or DDP's collectives and the compute's waits for "  \
    "them; "                                                                   \
    "the step line, JSONL and TensorBoard get the communication time per "     \
    "step and the fraction hidden behind compute (comm_ms, comm_exposed_ms, "  \
    "comm_hidden). With tensor parallelism the tp hook's collectives on the "  \
    "group 'tp' (all-reduces, with sequence parallel all-gathers and "         \
    "reduce-scatters, loss parallel's max and sums, the vocabulary-parallel "  \
    "embedding's) are timed the same way and reported beside them: "           \
    "tp_comm_ms, tp_comm_exposed_ms, tp_comm_hidden (\"| tp comm X ms "         \
    "hidden Y%\", TensorBoard comm/tp_*). Each tp op sits on the critical "     \
    "path (the next kernel reads its result), so its hidden fraction is ~0 "   \
    "by construction; exposed then measures what TP communication costs a "    \
    "step. Results are the same bits with it on or off.")

#define TR_CONFIG_KEYS_comm(X)                                                 \
  X(comm, init_timeout_seconds, INT, "300", 1, TR_CFG_NOMAX, NULL,             \
    "Timeout of every collective until the first gradient sync completes, "    \
    "and of the process group's set-up.")                                      \
  X(comm, train_timeout_seconds, INT, "100", 1, TR_CFG_NOMAX, NULL,            \
    "Timeout of every collective after the first gradient sync.")              \
  X(comm, trace_buf_size, INT, "20000", 0, TR_CFG_NOMAX, NULL,                 \
    "Flight-recorder entries kept per rank; 0 turns the recorder off.")        \
  X(comm, save_traces_folder, STR, "comm_traces", 0, 0, NULL,                  \
    "Flight-recorder dump folder inside dump_folder.")                         \
  X(comm, save_traces_file_prefix, STR, "rank_", 0, 0, NULL,                   \
    "Dump file name prefix; the rank number follows.")                         \
  X(comm, mode, ENUM, "default", 0, 0, "default|fake_backend|local_tensor",    \
    "fake_backend runs one process that plays rank fake_rank of a world of "  \
    "fake_world_size ranks without moving data (PyTorch's fake process "      \
    "group): every collective completes at once, so the layout's shapes, "    \
    "steps and memory of one rank can be checked on one machine. "            \
    "local_tensor is refused (not implemented).")                              \
  X(comm, fake_world_size, INT, "1", 1, 1048576, NULL,                         \
    "trainrun: under fake_backend, the world size the one process plays; "    \
    "the config is resolved for it. Refused under the other modes.")           \
  X(comm, fake_rank, INT, "0", 0, 1048575, NULL,                               \
    "trainrun: under fake_backend, the rank the process plays (below "        \
    "fake_world_size). Refused under the other modes.")                        \
  X(comm, backend, STR, "cpu:gloo,cuda:nccl", 0, 0, NULL,                      \
    "trainrun: process-group backend of the job's ranks, one of gloo, nccl, " \
    "mpi, or a list of device:backend pairs that picks the backend by "       \
    "tensor device. mpi trains a CPU job over Open MPI: under mpirun the "    \
    "ranks are mpirun's processes; trainrun --nproc-per-node N starts them "  \
    "through mpirun (one node).")                                              \
  X(comm, hang_timeout_seconds, INT, "600", 0, TR_CFG_NOMAX, NULL,             \
    "trainrun: a job whose collectives make no progress for this long dumps " \
    "every rank's flight recorder; 0 turns hang detection off.")               \
  X(comm, key, SECRET, NULL, 0, 0, NULL,                                       \
    "trainrun: shared secret of the job's store: the store the launcher "     \
    "hosts requires it, and every daemon and worker proves it before any "    \
    "command (HMAC challenge; the secret never crosses the wire). A node "    \
    "with a missing or different secret fails with \"authentication "         \
    "failed\" naming the endpoint. TRAINRUN_STORE_TOKEN is the other way to "  \
    "pass it (and keeps it out of files); when both are set this key wins. "  \
    "Never printed.")

#define TR_CONFIG_KEYS_activation_checkpoint(X)                                \
  X(activation_checkpoint, mode, ENUM, "selective", 0, 0,                      \
    "selective|full|memory_budget|none",                                       \
    "none keeps every activation; full: every transformer layer keeps only "  \
    "its input and recomputes its forward in backward; selective: see "       \
    "selective_ac_option. Losses and gradients are bit-identical in every "   \
    "mode. memory_budget is refused (it needs a compiler's partitioner).")     \
  X(activation_checkpoint, selective_ac_option, STR, "2", 0, 0, NULL,          \
    "Under selective: a number N recomputes every Nth layer as full does "    \
    "(layers N-1, 2N-1, ... counting from 0, as torchtitan); op keeps the "   \
    "outputs of the matmuls and of attention and recomputes the norm "         \
    "outputs and the GELU / SwiGLU product.")                                  \
  X(activation_checkpoint, memory_budget, FLOAT, "0.5", 0, 1, NULL,            \
    "Under memory_budget: fraction of the activation memory to keep "          \
    "(memory_budget itself is refused). Another value than the default logs "  \
    "a note that it changes nothing.")                                         \
  X(activation_checkpoint, preserve_rng_state, BOOL, "true", 0, 0, NULL,       \
    "Recompute with the random state of the first pass (trainrun's models "    \
    "have no dropout or other random state: nothing to preserve). Another "    \
    "value than the default logs a note that it changes nothing.")             \
  X(activation_checkpoint, early_stop, BOOL, "false", 0, 0, NULL,              \
    "Stop a recomputation as soon as the needed activations exist (not "       \
    "implemented: a recomputation runs the whole layer). Another value than "  \
    "the default logs a note that it changes nothing.")                        \
  X(activation_checkpoint, debug, BOOL, "false", 0, 0, NULL,                   \
    "Log what is recomputed (trainrun logs the policy at info level and "      \
    "each recomputation at debug level, TRAINRUN_LOG_LEVEL=debug, whatever "   \
    "this says). Another value than the default logs a note that it changes "  \
    "nothing.")

#define TR_CONFIG_KEYS_validation(X)                                           \
  X(validation, enable, BOOL, "false", 0, 0, NULL,                             \
    "Evaluate the loss on validation data during training.")                   \
  X(validation, dataset, STR, "c4_validation", 0, 0, NULL,                     \
    "Name of the validation dataset. trainrun downloads nothing: "             \
    "validation.enable without validation.dataset_path or split_fraction is "  \
    "refused, naming it.")                                                     \
  X(validation, dataset_path, OPT_STR, NULL, 0, 0, NULL,                       \
    "Validation data, in the forms training.dataset_path takes.")              \
  X(validation, split_fraction, FLOAT, "0.0", 0, 0.5, NULL,                    \
    "trainrun: fraction at the end of training.dataset_path held out as "     \
    "validation data when dataset_path is unset; training never reads it.")   \
  X(validation, local_batch_size, INT, "8", 1, TR_CFG_NOMAX, NULL,             \
    "Sequences per rank per validation step. Under pipeline parallelism "      \
    "they run forward only through the stages in micro-batches of "            \
    "pipeline_parallel_microbatch_size, which must divide it.")                \
  X(validation, seq_len, INT, "2048", 1, TR_CFG_NOMAX, NULL,                   \
    "Tokens per validation sequence.")                                         \
  X(validation, freq, INT, "10", 1, TR_CFG_NOMAX, NULL,                        \
    "Validate every this many training steps.")                                \
  X(validation, steps, INT, "-1", -1, TR_CFG_NOMAX, NULL,                      \
    "Validation steps per evaluation; -1 reads the whole validation set.")

#define TR_CONFIG_KEYS_debug(X)                                                \
  X(debug, seed, OPT_INT, NULL, 0, TR_CFG_NOMAX, NULL,                         \
    "Random seed for initialisation and data order; unset picks one at "      \
    "start (and logs it).")                                                    \
  X(debug, deterministic, BOOL, "false", 0, 0, NULL,                           \
    "Use only deterministic kernels, so runs repeat bit for bit. On the CPU "  \
    "this holds already (fixed reduction orders, no atomics) and the run "     \
    "says so; on GPUs cuDNN's attention backward writes dQ directly instead "  \
    "of summing it with fp32 atomics (the default, as PyTorch's), and a "      \
    "shape no such engine takes (or whose workspace, B x H x T^2 bf16, would " \
    "take over a quarter of the free memory) runs the flash/SIMT backward "    \
    "(cuBLAS is deterministic as trainrun uses it).")                          \
  X(debug, deterministic_warn_only, BOOL, "false", 0, 0, NULL,                 \
    "Under deterministic on GPUs: run cuDNN's atomic attention backward "      \
    "with a warning instead of declining it. Without deterministic it logs "   \
    "a note that it changes nothing.")                                         \
  X(debug, moe_force_load_balance, BOOL, "false", 0, 0, NULL,                  \
    "Route tokens to experts round-robin (trainrun's models have no "          \
    "mixture-of-experts layers). Another value than the default logs a note "  \
    "that it changes nothing.")                                                \
  X(debug, fault, LIST, "", 0, 0, NULL,                                        \
    "trainrun: faults to inject, each KIND:name=N:...; KIND is kill, hang, "  \
    "exit, slow, skip_collective or mismatch (see trainrun(1)).")
/* clang-format on */

#endif /* TRAINRUN_CONFIG_SCHEMA_H */
