"""The verifiable math rewards GRPO can train on (Open-R1's), with TRL's reward-function signature
f(prompts, completions, **columns) -> list of floats: `tag_count`, `format` and `accuracy` (which needs a
`solution` column). `--reward_funcs tag_count,format,accuracy` names them; `--system_prompt r1` is Open-R1's
<think>/<answer> system prompt, `--system_prompt humanline_math` the one of the paper's math runs."""

import re
from fractions import Fraction

R1_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The assistant "
    "first thinks about the reasoning process in the mind and then provides the user with the answer. The reasoning "
    "process and answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., "
    "<think> reasoning process here </think><answer> answer here </answer>"
)
# the authors' math recipes (open-r1-humanline, recipes/Qwen2.5-1.5B-Instruct/grpo/): tags on lines of their own
HUMANLINE_MATH_SYSTEM_PROMPT = (
    "You are a helpful AI Assistant that provides well-reasoned and detailed responses. You first think about the "
    "reasoning process as an internal monologue and then provide the user with the answer. Respond in the following "
    "format: <think>\n...\n</think>\n<answer>\n...\n</answer>"
)
SYSTEM_PROMPTS = {"r1": R1_SYSTEM_PROMPT, "humanline_math": HUMANLINE_MATH_SYSTEM_PROMPT}


def completion_text(completion):
    return (
        completion
        if isinstance(completion, str)
        else "".join(m["content"] for m in completion if m["role"] == "assistant")
    )


def tag_count_reward(prompts, completions, **columns):
    """Open-R1's tag_count: 0.25 for each of '<think>\\n', '\\n</think>\\n', '\\n<answer>\\n', '\\n</answer>'
    that appears exactly once."""
    tags = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")
    return [sum(0.25 for t in tags if completion_text(c).count(t) == 1) for c in completions]


FORMAT = re.compile(r"<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>\s*", re.DOTALL)


def format_reward(prompts, completions, **columns):
    """Open-R1's format: 1 if the whole completion is '<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>'
    (trailing whitespace allowed), else 0."""
    return [float(FORMAT.fullmatch(completion_text(c)) is not None) for c in completions]


def last_boxed(text):
    """The content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if there is none."""
    i = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if i < 0:
        return None
    start = text.index("{", i) + 1
    depth = 1
    for j in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[start:j]
    return None


def extract_answer(text):
    """The final answer of a completion or a solution: the last \\boxed{} inside the last <answer>...</answer>
    (or anywhere when there are no tags), else the tags' content; None if neither is there."""
    tagged = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    boxed = last_boxed(tagged[-1] if tagged else text)
    return boxed if boxed is not None else (tagged[-1] if tagged else None)


def normalize_answer(s):
    """Strip spaces, $, a trailing '.', \\text{} / \\mbox{} wrappers, \\left / \\right, thin spaces, a leading
    '+' and a leading 'x =' ; \\dfrac and \\tfrac become \\frac."""
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])|\\[!,;:]|\$", "", s)
    s = re.sub(r"\s+", "", s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")).rstrip(".")
    s = re.sub(r"^[a-zA-Z]=", "", s)
    return s[1:] if s.startswith("+") else s


NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"


def to_number(s):
    """An exact Fraction for a normalised integer, decimal, a/b, \\frac{a}{b} or \\frac ab (one digit each),
    with an optional '-'; None otherwise."""
    sign = -1 if s.startswith("-") else 1
    s = s[1:] if sign < 0 else s
    m = (
        re.fullmatch(rf"\\frac\{{({NUMBER})\}}\{{({NUMBER})\}}", s)
        or re.fullmatch(r"\\frac(\d)(\d)", s)
        or re.fullmatch(rf"({NUMBER})/({NUMBER})", s)
    )
    try:
        if m:
            return sign * Fraction(m.group(1)) / Fraction(m.group(2))
        return sign * Fraction(s) if re.fullmatch(NUMBER, s) else None
    except ZeroDivisionError:
        return None


def answers_match(predicted, gold):
    p, g = normalize_answer(predicted), normalize_answer(gold)
    if p == g:
        return True
    p, g = to_number(p), to_number(g)
    return p is not None and g is not None and p == g


def accuracy_reward(prompts, completions, solution=None, **columns):
    """1 if the completion's answer (last \\boxed{}, or <answer> tags) equals the solution's (its last \\boxed{},
    else its <answer> tags, else the whole solution), else 0. Equal means equal after `normalize_answer`, or,
    where both are numbers (integers, decimals, a/b, \\frac), numerically equal (exact fractions: 0.5 = 1/2).
    What a full math verifier (Open-R1's math_verify) judges and this does not: symbolic equivalence
    (2\\sqrt{2} vs \\sqrt{8}, x+1 vs 1+x, \\pi/2 vs \\frac{\\pi}{2}), sets, tuples and intervals up to order or
    spacing conventions, thousands separators (10,000), percentages, units and degrees, scientific notation,
    equations other than a leading 'x =', matrices, and answers stated without tags or \\boxed{}."""
    if solution is None:
        raise ValueError("the 'accuracy' reward needs a 'solution' column in the dataset")
    out = []
    for c, sol in zip(completions, solution):
        predicted = extract_answer(completion_text(c))
        gold = extract_answer(sol)
        gold = sol if gold is None else gold
        out.append(float(predicted is not None and answers_match(predicted, gold)))
    return out


REWARD_FUNCS = {"tag_count": tag_count_reward, "format": format_reward, "accuracy": accuracy_reward}


def default_weights(names):
    """--reward_weights when not given: 1 each, but 1, 1, 8 for tag_count, format, accuracy (Open-R1's math runs)."""
    math_rewards = set(names) == {"tag_count", "format", "accuracy"}
    return ",".join("8" if math_rewards and n == "accuracy" else "1" for n in names)
