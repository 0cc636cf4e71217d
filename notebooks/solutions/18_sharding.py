"""Solutions to chapter 18's exercises (sharding): one function per exercise, named as the exercise."""

import numpy as np


def reduce_scatter(buffers):
    buffers = np.asarray(buffers)
    n = len(buffers)
    total = buffers.sum(axis=0)  # (N n,): the sum over the ranks
    return total.reshape(n, -1)  # row r: elements r n .. (r + 1) n, what rank r keeps


def tensor_parallel_kv(w_k, d_k, tensor_parallel, num_heads):
    # contiguous blocks of columns: rank t's kv heads t H_kv/K .. (t + 1) H_kv/K - 1, whole heads of d_k each
    return np.stack(np.split(w_k, tensor_parallel, axis=1))  # (K, d_model, H_kv / K d_k)
