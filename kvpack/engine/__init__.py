"""The serving engine (vLLM's shapes): `sequence`, `block_manager` (paged blocks + prefix cache),
`scheduler` (continuous batching, chunked prefill, preemption), `sampler`, `model_runner`,
`llm_engine` (`LLMEngine`), `outputs` (`RequestOutput`). Imports stay lazy: `import kvpack.engine`
loads nothing heavy."""
