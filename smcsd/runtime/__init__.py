"""What every decoding program runs on: the static program spec and traced inputs, the method registry and its
compile cache (with a read-only accessor, `compiled_programs`), the traced helpers the methods share (prefill,
verification calls, stop detection, output writes; `engine`), device-mesh placement (`mesh`) and the typed
statistics a decode returns (`stats`)."""

from .engine import (METHODS, KVCache, MethodDef, MethodOptions, ProgramInputs, ProgramParts, StaticSpec,  # noqa: F401
                     bucket, loop_program, clear_compile_cache, compiled_program, compiled_programs, first_stop_count, hidden_concat,
                     is_stop, prefill, register_method, release_programs, verify_call, write_tokens)
from .stats import DecodeResult, DecodeStats  # noqa: F401

__all__ = ["METHODS", "DecodeResult", "DecodeStats", "KVCache", "MethodDef", "MethodOptions", "ProgramInputs",
           "ProgramParts", "StaticSpec", "loop_program", "bucket", "clear_compile_cache", "compiled_program", "compiled_programs", "first_stop_count",
           "hidden_concat", "is_stop", "prefill", "register_method", "release_programs", "verify_call", "write_tokens",
           "engine", "mesh", "stats"]
