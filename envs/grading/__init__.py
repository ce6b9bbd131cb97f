"""Answer grading: the reward of every trajectory and every reported accuracy.

    get_grader(name) -> Grader                              # the process-wide grader of env.grader
    grade_answer(response, gold) -> bool                    # extract the final answer, compare
    Grader(name).check(response, gold) -> GradeResult       # verdict + answer + seconds + timeout
    extract_answer(response) -> str | None                  # which part of a response is its answer
    answers_equivalent(pred, gold) -> bool                  # compare two extracted answers
    GRADERS                                                 # the registry of graders (env.grader)
    GradingMethod, GradingContext, Verdict                  # a grader, what it may use, what it returns

The modules, by concept (the stages and their rules are documented in `grader`):
- `grader`: the graders (builtin, boxed, math_verify), the result cache, the bounded worker process;
- `protocol`: the graders' seam (`GradingMethod`, the public `GradingContext` it sees, `Verdict`);
- `extract`, `extract_prose`: where a response states its final answer;
- `normalize`, `numbers`, `units`, `forms`, `commutative`, `structure`, `equivalence`: the
  in-process comparison (LaTeX text, exact numbers and the decimal rule, quantities with units,
  forms such as bases and clock times, the order of commuting factors, structured answers);
- `_worker`, `_symbolic`, `_solution_sets`, `_exact`, `_mv_stage`: the worker process (sympy,
  math-verify), never imported by this package.

`import envs.grading` is fast: it loads neither sympy, math-verify nor torch.
"""

from envs.grading.equivalence import normalize_answer, parse_number
from envs.grading.extract import extract_answer
from envs.grading.grader import GRADERS, Grader, GradeResult, answers_equivalent, get_grader, grade_answer
from envs.grading.protocol import GradingContext, GradingMethod, Verdict

__all__ = [
    "GRADERS",
    "GradeResult",
    "Grader",
    "GradingContext",
    "GradingMethod",
    "Verdict",
    "answers_equivalent",
    "extract_answer",
    "get_grader",
    "grade_answer",
    "normalize_answer",
    "parse_number",
]
