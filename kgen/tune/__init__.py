"""`kgen tune`: search a kernel's schedules, compile them in parallel, time them on the GPU and
keep the fastest per kernel, arch, GPU and size bucket.

    space.py    the candidates: the target's configurations filled into the lines a kernel
                leaves out (kgen/lower/builder.py), lowered, emitted, deduplicated
    compile.py  NVRTC over every CPU core (spawned processes), through the cubin cache
    measure.py  the GPU part: inputs rotated past L2, CUDA-event medians, the reference check
    tuner.py    the steps in order, and the report
    cache.py    the winners on disk, keyed by kernel hash, arch, GPU name and size bucket
    codec.py    a Config as JSON and back
    select.py   using a cache entry: `kgen run` and `kgen.load` (a variant per size bucket)
    write.py    `--write`: the winning lines into the .kg text, comments kept
    show.py     the progress bars and the table

Nothing here is imported by `import kgen`; the submodules load on use.
"""
