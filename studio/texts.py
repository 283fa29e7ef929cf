"""The page's words: example questions, the paper, the drafting switch's choices, and the accordions' texts."""
from __future__ import annotations

from present.meter import METHOD_NAMES

EXAMPLES = [
    ("Conversation", "Why is the sky blue? Answer in a short paragraph."),
    ("Code", "Write a Python function that checks whether two words are anagrams, with a short docstring."),
    ("Translation", "Translate to French: My brother forgot his umbrella, so he came home soaking wet."),
    ("Summarization", "Summarize in two sentences: Token Recycling stores the top-k next-token candidates of every "
                      "token it has seen in an adjacency matrix. Each step it builds a draft tree from that matrix, "
                      "verifies the whole tree with one forward pass, accepts the longest correct path and then "
                      "overwrites the matrix rows with fresh candidates from the same forward pass. It needs no "
                      "extra model and no training."),
    ("Math", "A shop sells pencils at 3 for $1. How much do 12 pencils cost? Explain step by step."),
    ("RAG QA", "Context: The Eiffel Tower was completed in 1889 for the World's Fair in Paris. It is 330 metres tall "
               "and was the tallest man-made structure until 1930.\n\nQuestion: When was the Eiffel Tower completed "
               "and how tall is it?"),
]

PAPER_SHORT = "Luo et al., *Turning Trash into Treasure*, ACL 2025, [arXiv:2408.08696](https://arxiv.org/abs/2408.08696)"
PAPER = ("Luo et al., *Turning Trash into Treasure: Accelerating Inference of Large Language Models with Token "
         "Recycling*, ACL 2025, [arXiv:2408.08696](https://arxiv.org/abs/2408.08696)")

# The drafting switch: (template, label, one sentence). It sets the decoding settings' template (see _wire). Its
# labels are the names the meter gives each drafting's figures (present.meter.METHOD_NAMES).
# the Drafting choices, one change at a time, as the side-by-side compares them (its cards say each one's words);
# under them one line (a reader could not read three notes in small grey type, and they held 10% of the page's words)
DRAFTING = tuple((name, METHOD_NAMES[name]) for name in ("2.2.2", "adaptive", "hybrid"))
DRAFTING_INFO = ("One change at a time: the paper's static tree (made for GPUs), then sized for this machine, then "
                 "also copying earlier text.")

WHY_NUMBERS = """
**Expected speedup.** A step verifies N tokens in one forward and gains the accepted drafts plus one bonus token, so

  speedup ≈ tokens per step (accepted drafts + the bonus) ÷ t(N)/t(1),

where t(N)/t(1) is what a step verifying N tokens costs against a plain decoding step. The meter measures both
sides, Token Recycling and plain decoding timed in turns over the same tokens, and the cost panel works the formula
out with the meter's timings of each size of step and this answer's accepted tokens, so the two agree (or the panel
says why they do not). Before the meter has measured, the panel estimates t(N)/t(1) from this machine's cost curve,
labelled as an estimate. When the cost curve was timed on a busy machine, or the meter found the timings too noisy,
no estimate is shown.

**Why a big tree pays on a GPU and not on a CPU.** On a GPU a forward is *memory-bound*: reading the weights takes
the time, so a forward of the paper's 80-token tree costs about as much as a forward of one token, and every
accepted draft is nearly free. On a CPU a forward is *compute-bound*: each extra token costs arithmetic, t(N) grows
with N, and an 80-token tree can cost several one-token forwards, more than its 2-3 accepted tokens win back. That is
why the CPU default is the cost-sized tree (*adaptive*, or *hybrid* with context runs), which drafts only as many
tokens as this machine's t(N) pays for, and sometimes none.

**Greedy or sampling.** At temperature 0 the answer is exactly plain decoding's; with sampling, the same seed gives
the same answer as plain decoding. The line under the chat says which one the shown answer used.

**The paper.** """

HOW_IT_WORKS = """
**Token Recycling** (Luo et al., 2025) speeds up decoding without a draft model:

1. **Adjacency matrix** `M [V, k]`: for every token, the top-k next tokens the model predicted the last time it saw it.
2. **Draft tree**: starting from the last token, candidates are read from `M` level by level following a fixed
   template (the paper's *2.2.2* tree has 80 nodes over 6 levels).
3. **One forward pass** verifies the whole tree with a tree attention mask.
4. **Accept** the longest path that agrees with the model, plus one **bonus** token the model predicts after it.
5. **Recycle**: the top-k of every tree node's logits overwrite that token's row of `M`, so the matrix keeps learning.

Greedy (or seeded) output is token-identical to plain decoding; only the number of forward passes drops.

**The speedup meter** re-runs the answer from the state it started in, Token Recycling and plain decoding in
short turns over the same tokens, so a busy machine slows both alike. It shows the ratio with its standard
error, or says *too noisy to measure* when the turns disagree or the ratio is larger than the accepted tokens per
step allow.

**The cost panel** says why a big tree can be slower: a step's speed ≈ the tokens it gained ÷ what a step of N tokens
costs against a plain decoding step, t(N)/t(1). Once the meter has measured the answer, t(N)/t(1) is its own timing
of Token Recycling's steps of that size against plain decoding's (sizes it did not time follow this machine's cost
curve), so the panel and the meter tell one story; before that, it is an estimate from the cost curve the adaptive
and hybrid trees measure, labelled so. A curve timed while the machine was busy is not shown, and when the meter
says *too noisy*, no panel claims a speed.

**⚑ Race** replays a measured answer twice side by side, Token Recycling at its recorded step times and plain
decoding at the pace the meter measured, in your browser: nothing is decoded again. Without the meter's trusted
figure there is no race. **Presentation view** (or `?view=present` in the address) lays the meter, the tree, the
matrix window, the step story and the step controls out for a 1280×720 projector; Microscope opens the step microscope.
"""
