"""Chapter 9's notebook: the cells that try each exercise.

Each "try" cell runs right after the exercise it is named for, on the lesson's
small examples, and prints what a correct answer gives in a trailing comment.
"""
# ruff: noqa: F821  (names come from the notebook's exercise cells; the cells import)

# %% try flash_attention_forward
import torch.nn.functional as F

q = torch.tensor([[1.0]])  # section 4's worked example: one query, d = 1
k, v = torch.tensor([[0.0], [1.0], [2.0]]), torch.tensor([[1.0], [2.0], [4.0]])
out, lse = flash_attention_forward(q, k, v, block_size=2)
print(out, lse)  # tensor([[3.2405]]) tensor([2.4076])

torch.manual_seed(0)
q, k, v = torch.randn(2, 6, 8), torch.randn(2, 10, 8), torch.randn(2, 10, 8)  # L = 6, S = 10
causal = torch.ones(6, 10, dtype=torch.bool).tril(10 - 6)  # chapter 4's bottom-right mask, (L, S)
out, lse = flash_attention_forward(q, k, v, causal=True, block_size=3)
print(torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=causal), atol=1e-6))  # True

# %% try flash_attention_backward
q = torch.tensor([[1.0]])  # the worked example again, dO = 1
k, v = torch.tensor([[0.0], [1.0], [2.0]]), torch.tensor([[1.0], [2.0], [4.0]])
out, lse = flash_attention_forward(q, k, v, block_size=2)
dq, dk, dv = flash_attention_backward(q, k, v, out, lse, torch.ones(1, 1), block_size=2)
print(dq.flatten(), dk.flatten(), dv.flatten())
# tensor([0.7070]) tensor([-0.2017, -0.3036,  0.5053]) tensor([0.0900, 0.2447, 0.6652])

torch.manual_seed(0)
q, k, v = (torch.randn(2, n, 8, dtype=torch.float64, requires_grad=True) for n in (6, 10, 10))
grad_out = torch.randn(2, 6, 8, dtype=torch.float64)
expected = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v), (q, k, v), grad_out)
out, lse = flash_attention_forward(q.detach(), k.detach(), v.detach(), block_size=4)
mine = flash_attention_backward(q.detach(), k.detach(), v.detach(), out, lse, grad_out, block_size=4)
print(all(torch.allclose(a, b) for a, b in zip(mine, expected)))  # True

# %% try FlashAttentionFunction
q, k, v = (torch.randn(2, n, 8, dtype=torch.float64, requires_grad=True) for n in (6, 10, 10))
out = flash_attention(q, k, v, True, 4)  # FlashAttentionFunction.apply(q, k, v, True, 4)
print(type(out.grad_fn).__name__)  # FlashAttentionFunctionBackward
print([tuple(t.shape) for t in out.grad_fn.saved_tensors])  # [(2, 6, 8), (2, 10, 8), (2, 10, 8), (2, 6, 8), (2, 6)]
out.sum().backward()  # runs your backward
causal = torch.ones(6, 10, dtype=torch.bool).tril(10 - 6)
expected = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=causal).sum(), (q, k, v))
print(all(torch.allclose(t.grad, e) for t, e in zip((q, k, v), expected)))  # True
