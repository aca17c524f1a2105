"""The staged CTA tile: D[m, n] = sum_k A[m, k] B[k, n], activations through shared memory.

One concept a module, as a GEMM library splits its tile: ``geometry`` (the CTA's shape,
the chunk, the launch), ``rule`` (split-K and the tile rule's score), ``operands`` (the A
and B sources the loop calls), ``mainloop`` (the chunk loop), ``epilogue`` (the int32 or
rescaled output) and ``specs`` (the KernelSpecs a kernel module builds from them).
"""
