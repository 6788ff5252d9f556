"""x86: ``X86InductorQuantizer``'s rules and what inductor's oneDNN lowering ran."""
