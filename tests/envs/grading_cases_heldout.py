"""Held-out grading cases for the kinds of grading_cases_prose_forms.py, written before the grader
changes they score and not used to tune them: `scripts/bench_grading.py` grades them in a separate
line, and tests/envs/test_envs_grading_prose_forms.py only checks that none of them is a false
positive (a miss here is reported, not hidden by editing the label).

Their first and only blind grading (once the development cases passed): builtin
150/154 with 0 false positives, math-verify 123/154 with 9. The four misses ("option E is
correct"; "gives $2a = 26$, so $a = 13$" read as "2a = 26"; "9:15 \\text{ PM}" read as "9:15";
"\\cos 2\\theta" read as cos(2)*theta) were bugs of general rules, fixed with new development
cases of the same shapes; since then these cases are no longer unseen, and a score on them is
not an independent one.

Each case is (gold, response, label, kind); the label is what a careful human grader says. Styles
differ on purpose from the development cases (grading_cases_prose_forms.py): GSM8K rationales with
<<calculator>> marks, Minerva-style closing lines, multiple-choice sentences in English and
Chinese, R1-style <think> blocks, OlympiadBench-style multi-part answers, physics constants.
"""

CASES: list[tuple[str, str, bool, str]] = [
    # ---- the answer as the last inline math of a sentence
    ("\\frac{\\pi}{4}", "We conclude that the angle between the vectors is $\\frac{\\pi}{4}$.", True, "prose_span"),
    ("\\frac{\\pi}{4}", "We conclude that the angle between the vectors is $\\frac{\\pi}{3}$.", False, "prose_span"),
    ("(-\\infty, 2]", "Hence the function is decreasing on $(-\\infty, 2]$.", True, "prose_span"),
    ("(-\\infty, 2]", "Hence the function is decreasing on $(-\\infty, 2)$.", False, "prose_span"),
    ("y = 3x - 5", "The tangent line at the point is therefore \\(y = 3x - 5\\).", True, "prose_span"),
    ("y = 3x - 5", "The tangent line at the point is therefore \\(y = 3x + 5\\).", False, "prose_span"),
    ("24", "Multiplying, the product of the roots equals $24$, which is what we wanted.", True, "prose_span"),
    (
        "24",
        "Multiplying, we get $2 \\cdot 3 \\cdot 4$, and adding the remaining root gives something I could not compute.",
        False,
        "prose_span",
    ),
    (
        "\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}",
        "Thus $A^{2}$ equals the identity matrix $\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}$.",
        True,
        "prose_span",
    ),
    (
        "\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}",
        "Thus $A^{2}$ equals the matrix $\\begin{pmatrix} 0 & 1 \\\\ 1 & 0 \\end{pmatrix}$.",
        False,
        "prose_span",
    ),
    ("5", "Solving gives $x=5$, so the width of the garden is $5$ meters.", True, "prose_span"),
    ("5", "Solving gives $x=5$, so the length of the garden is $2x = 10$ meters.", False, "prose_span"),
    # ---- "answer is" / "answers are ... and ..."
    ("12", "So the answer is 12 apples.", True, "answer_is"),
    ("12", "So the answer is 13 apples.", False, "answer_is"),
    ("-1", "Putting everything together, the required value is $-1$, so our answer is $-1$.", True, "answer_is"),
    ("2, 3", "The answers are $x=2$ and $x=3$.", True, "answer_is"),
    ("2, 3", "The answers are $x=2$ and $x=4$.", False, "answer_is"),
    ("\\frac{7}{2}", "I believe the correct answer is $\\dfrac{7}{2}$, since both cases agree.", True, "answer_is"),
    ("\\frac{7}{2}", "I believe the correct answer is $\\dfrac{2}{7}$, since both cases agree.", False, "answer_is"),
    ("1, -4", "Therefore the answers are $1$ and $-4$.", True, "answer_is"),
    ("1, -4", "Therefore the answers are $1$ and $4$.", False, "answer_is"),
    ("30", "My answer is: 30 degrees.", True, "answer_is"),
    ("30", "My answer is: 60 degrees.", False, "answer_is"),
    ("8", "Is the answer 8? Let me check again... no, it cannot be.", False, "answer_is"),
    # ---- GSM8K rationales
    (
        "72",
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
        True,
        "gsm8k",
    ),
    (
        "72",
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+22 = <<48+22=70>>70 clips altogether in April and May.\n#### 70",
        False,
        "gsm8k",
    ),
    (
        "18",
        "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18",
        True,
        "gsm8k",
    ),
    ("18", "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n#### 9", False, "gsm8k"),
    ("5", "Each box holds 20 / 4 = 5 pens.\n#### 5.0", True, "gsm8k"),
    ("5", "I first thought the answer is 5, but the boxes are shared.\n#### 6", False, "gsm8k"),
    ("3", "There are 3 + 4 = 7 people.\n#### 7", False, "gsm8k"),
    # ---- an option letter in a sentence
    ("B", "Comparing all four choices, the correct option is (B).", True, "option"),
    ("B", "Comparing all four choices, the correct option is (C).", False, "option"),
    ("D", "由以上分析可知，答案：D", True, "option"),
    ("D", "由以上分析可知，答案：A", False, "option"),
    ("C", "So the right choice is C, because the others fail.", True, "option"),
    ("C", "So the right choice is A, because C fails.", False, "option"),
    ("A", "Answer: (A) 12", True, "option"),
    ("A", "Answer: (E) 12", False, "option"),
    ("E", "After eliminating the rest, option E is correct.", True, "option"),
    ("E", "After eliminating the rest, option D is correct.", False, "option"),
    ("B", "A is wrong and B is wrong, so it must be D.", False, "option"),
    # ---- worked solutions without a box: the last math is the result
    (
        "13",
        "Let the two numbers be $a$ and $b$. We know $a + b = 20$ and $a - b = 6$.\n"
        "Adding the equations gives $2a = 26$, so $a = 13$.",
        True,
        "worked",
    ),
    (
        "13",
        "Let the two numbers be $a$ and $b$. We know $a + b = 20$ and $a - b = 6$.\n"
        "Adding the equations gives $2a = 26$, so $a = 12$.",
        False,
        "worked",
    ),
    (
        "\\frac{1}{6}",
        "There are $36$ equally likely outcomes. The favorable ones are $(1,6),(2,5),(3,4),(4,3),(5,2),(6,1)$, "
        "so the probability is $\\frac{6}{36} = \\frac{1}{6}$.",
        True,
        "worked",
    ),
    (
        "\\frac{1}{6}",
        "There are $36$ equally likely outcomes. The favorable ones are $(1,6),(2,5),(3,4),(4,3),(5,2),(6,1)$, "
        "so the probability is $\\frac{6}{36} = \\frac{1}{5}$.",
        False,
        "worked",
    ),
    (
        "\\frac{1}{6}",
        "There are $36$ equally likely outcomes. The favorable ones are $(1,6),(2,5),(3,4),(4,3),(5,2),(6,1)$.",
        False,
        "worked",
    ),
    (
        "100",
        "First, $1 + 2 + \\cdots + 10 = 55$.\nThen the sum of the first ten odd numbers is $1 + 3 + \\cdots + 19 = 100$.",
        True,
        "worked",
    ),
    (
        "100",
        "First, $1 + 3 + \\cdots + 19 = 100$.\nThen we also need $1 + 2 + \\cdots + 10 = 55$.",
        False,
        "worked",
    ),
    # ---- a boxed answer inside <think> followed by other text
    (
        "4",
        "<think>\nTry \\boxed{4}. Hmm, recheck.\n</think>\nAfter rechecking, the result is $6$.",
        False,
        "think_final",
    ),
    (
        "6",
        "<think>\nTry \\boxed{4}. Hmm, recheck.\n</think>\nAfter rechecking, the result is $6$.",
        True,
        "think_final",
    ),
    ("4", "<think>so \\boxed{4}</think>\nI need to double-check this before answering.", False, "think_final"),
    ("4", "<think>The answer should be \\boxed{4}.</think>\n\n", True, "think_final"),
    ("4", "<think>maybe \\boxed{4}</think>Sorry, I cannot solve this.", False, "think_final"),
    ("4", "<think>compute: 2+2 = 4, \\boxed{4}</think>\n**Final answer:** 4", True, "think_final"),
    # ---- several boxes or a listed set against a gold set or tuple list
    ("\\{1, 5\\}", "The solutions are \\(\\boxed{5}\\) and \\(\\boxed{1}\\).", True, "multi_answer"),
    ("\\{1, 5\\}", "The solutions are \\(\\boxed{5}\\) and \\(\\boxed{-1}\\).", False, "multi_answer"),
    ("(1, 2), (2, 1)", "$\\boxed{(2, 1)}$, $\\boxed{(1, 2)}$", True, "multi_answer"),
    ("(1, 2), (2, 1)", "$\\boxed{(2, 1)}$, $\\boxed{(2, 1)}$", False, "multi_answer"),
    ("(1, 2), (2, 1)", "$\\boxed{(1, 2)}$", False, "multi_answer"),
    ("-2, 3", "x = \\boxed{-2} \\text{ or } x = \\boxed{3}", True, "multi_answer"),
    ("-2, 3", "x = \\boxed{-2} \\text{ or } x = \\boxed{-3}", False, "multi_answer"),
    ("3, 4, 5", "The side lengths are \\boxed{5}, \\boxed{4}, \\boxed{3}.", True, "multi_answer"),
    ("3, 4, 5", "The side lengths are \\boxed{3}, \\boxed{4}.", False, "multi_answer"),
    # ---- \pm against a set
    ("x = \\pm \\sqrt{3}", "\\boxed{-\\sqrt{3}, \\sqrt{3}}", True, "pm_set"),
    ("x = \\pm \\sqrt{3}", "\\boxed{\\sqrt{3}}", False, "pm_set"),
    ("\\{-\\frac{1}{2}, \\frac{1}{2}\\}", "\\boxed{\\pm\\frac12}", True, "pm_set"),
    ("\\{-\\frac{1}{2}, \\frac{1}{2}\\}", "\\boxed{\\pm 2}", False, "pm_set"),
    ("2 \\pm i", "\\boxed{2+i, 2-i}", True, "pm_set"),
    ("2 \\pm i", "\\boxed{-2+i, -2-i}", False, "pm_set"),
    # ---- labelled answers against tuples
    ("(3, 1), (1, 3)", "\\boxed{x=1, y=3 \\text{ or } x=3, y=1}", True, "labelled_sets"),
    ("(3, 1), (1, 3)", "\\boxed{x=1, y=3 \\text{ or } x=3, y=3}", False, "labelled_sets"),
    ("(a,b) = (2, 5)", "\\boxed{a = 2, b = 5}", True, "labelled_sets"),
    ("(a,b) = (2, 5)", "\\boxed{a = 5, b = 2}", False, "labelled_sets"),
    ("m=1,n=2; m=2,n=1", "\\boxed{(2,1),(1,2)}", True, "labelled_sets"),
    ("m=1,n=2; m=2,n=1", "\\boxed{(1,1),(2,2)}", False, "labelled_sets"),
    # ---- base subscripts
    ("101_2", "\\boxed{101_{2}}", True, "base"),
    ("101_2", "\\boxed{110_2}", False, "base"),
    ("333_4", "The number in base four is $333_{4}$.", True, "base"),
    ("333_4", "\\boxed{333_5}", False, "base"),
    ("1000_{6}", "\\boxed{1000_6}", True, "base"),
    ("1000_{6}", "\\boxed{100_6}", False, "base"),
    # ---- percent against a plain rate
    ("0.15", "\\boxed{15\\%}", True, "percent_rate"),
    ("0.15", "\\boxed{1.5\\%}", False, "percent_rate"),
    ("40\\%", "\\boxed{0.4}", True, "percent_rate"),
    ("40\\%", "\\boxed{0.04}", False, "percent_rate"),
    ("\\frac{3}{4}", "The probability is 75%.", True, "percent_rate"),
    ("\\frac{3}{4}", "The probability is 7.5%.", False, "percent_rate"),
    # ---- clock times
    ("9:45", "\\boxed{09:45}", True, "clock"),
    ("9:45", "\\boxed{9:54}", False, "clock"),
    ("21:15", "\\boxed{9:15 \\text{ PM}}", True, "clock"),
    ("21:15", "\\boxed{9:15 \\text{ AM}}", False, "clock"),
    ("7:30 a.m.", "\\boxed{7:30:00}", True, "clock"),
    ("7:30 a.m.", "\\boxed{19:30}", False, "clock"),
    # ---- a function named differently
    ("y = x^2 - 1", "\\boxed{f(x) = x^2 - 1}", True, "function"),
    ("y = x^2 - 1", "\\boxed{f(x) = x^2 + 1}", False, "function"),
    ("g(t) = 5t", "\\boxed{y = 5t}", True, "function"),
    ("g(t) = 5t", "\\boxed{y = 5}", False, "function"),
    ("f^{-1}(x) = \\frac{x-3}{2}", "\\boxed{y = \\frac{x - 3}{2}}", True, "function"),
    ("f^{-1}(x) = \\frac{x-3}{2}", "\\boxed{y = 2x + 3}", False, "function"),
    ("y = 2x + 1", "\\boxed{x = 2y + 1}", False, "function"),
    # ---- reordered factors and sums inside larger expressions
    ("\\frac{1+\\sqrt{5}}{2}", "\\boxed{\\frac{\\sqrt{5}+1}{2}}", True, "reorder"),
    ("\\frac{1+\\sqrt{5}}{2}", "\\boxed{\\frac{\\sqrt{5}-1}{2}}", False, "reorder"),
    ("(x-1)(x+3)", "\\boxed{(x+3)(x-1)}", True, "reorder"),
    ("(x-1)(x+3)", "\\boxed{(x+3)(x+1)}", False, "reorder"),
    ("2\\pi r h", "\\boxed{2 h r \\pi}", True, "reorder"),
    ("2\\pi r h", "\\boxed{\\pi r^2 h}", False, "reorder"),
    ("\\sqrt{3+2\\sqrt{2}}", "\\boxed{\\sqrt{2\\sqrt{2}+3}}", True, "reorder"),
    ("\\sqrt{3+2\\sqrt{2}}", "\\boxed{\\sqrt{3\\sqrt{2}+2}}", False, "reorder"),
    ("(1 + \\sqrt{2}, 3)", "\\boxed{(\\sqrt{2} + 1, 3)}", True, "reorder"),
    ("(1 + \\sqrt{2}, 3)", "\\boxed{(3, \\sqrt{2} + 1)}", False, "reorder"),
    # ---- equations and inequalities equivalent after rearrangement
    ("x = 3 \\text{ or } x = -3", "\\boxed{x^2 = 9}", True, "solved"),
    ("x = 3 \\text{ or } x = -3", "\\boxed{x^2 = 3}", False, "solved"),
    ("x = 3 \\text{ or } x = -3", "\\boxed{x = 3}", False, "solved"),
    ("|x - 1| \\le 2", "\\boxed{-1 \\le x \\le 3}", True, "solved"),
    ("|x - 1| \\le 2", "\\boxed{-1 < x < 3}", False, "solved"),
    ("x > 2 \\text{ or } x < -2", "\\boxed{|x| > 2}", True, "solved"),
    ("x > 2 \\text{ or } x < -2", "\\boxed{|x| < 2}", False, "solved"),
    ("x \\ge 1 \\text{ and } x \\le 4", "\\boxed{[1, 4]}", True, "solved"),
    ("x \\ge 1 \\text{ and } x \\le 4", "\\boxed{[1, 4)}", False, "solved"),
    # ---- trigonometric identities
    ("1", "\\boxed{\\sin^2\\theta + \\cos^2\\theta}", True, "trig"),
    ("1", "\\boxed{\\sin^2\\theta - \\cos^2\\theta}", False, "trig"),
    ("\\sin 2x", "\\boxed{2\\sin x\\cos x}", True, "trig"),
    ("\\sin 2x", "\\boxed{2\\sin x}", False, "trig"),
    ("\\cos 2\\theta", "\\boxed{1 - 2\\sin^2\\theta}", True, "trig"),
    ("\\cos 2\\theta", "\\boxed{1 - 2\\cos^2\\theta}", False, "trig"),
    ("\\tan x", "\\boxed{\\frac{\\sin x}{\\cos x}}", True, "trig"),
    ("\\tan x", "\\boxed{\\frac{\\cos x}{\\sin x}}", False, "trig"),
    ("\\frac{\\sqrt{6}-\\sqrt{2}}{4}", "\\boxed{\\sin 15^\\circ}", True, "trig"),
    ("\\frac{\\sqrt{6}-\\sqrt{2}}{4}", "\\boxed{\\cos 15^\\circ}", False, "trig"),
    # ---- numbers written in words
    ("42", "\\boxed{\\text{forty-two}}", True, "words"),
    ("42", "\\boxed{\\text{twenty-four}}", False, "words"),
    ("1000", "The answer is one thousand.", True, "words"),
    ("1000", "The answer is one hundred.", False, "words"),
    ("3", "There are three of them, so the answer is three.", True, "words"),
    ("3", "The answer is thirteen.", False, "words"),
    # ---- scientific notation
    ("3 \\times 10^{8}", "\\boxed{3e8}", True, "sci"),
    ("3 \\times 10^{8}", "\\boxed{3e-8}", False, "sci"),
    ("1.6 \\times 10^{-19}", "\\boxed{1.6\\cdot 10^{-19}}", True, "sci"),
    ("1.6 \\times 10^{-19}", "\\boxed{1.6\\cdot 10^{19}}", False, "sci"),
    ("6.67\\times10^{-11}", "\\boxed{6.67E-11}", True, "sci"),
    ("6.67\\times10^{-11}", "\\boxed{6.76E-11}", False, "sci"),
    ("2.5 \\times 10^{3}", "\\boxed{2500}", True, "sci"),
    ("2.5 \\times 10^{3}", "\\boxed{25000}", False, "sci"),
    # ---- exact values that are merely close
    ("\\frac{999999}{1000000}", "\\boxed{\\frac{999998}{999999}}", False, "closeness"),
    ("1", "\\boxed{2^{1/2^{100}}}", False, "closeness"),
    ("[1, 2]", "\\boxed{[3^{1/3^{50}}, 2]}", False, "closeness"),
    ("\\pi", "\\boxed{\\frac{355}{113}}", False, "closeness"),
    ("\\sqrt{2}", "\\boxed{\\frac{665857}{470832}}", False, "closeness"),
    ("\\ln 2", "\\boxed{0.6931471805599453}", True, "closeness"),
    ("\\frac{1}{3}", "\\boxed{0.3333333333}", False, "closeness"),
    ("\\sqrt{2}", "\\boxed{\\frac{2}{\\sqrt{2}}}", True, "closeness"),
    ("10^{-20}", "\\boxed{0}", False, "closeness"),
    ("x", "\\boxed{x + 10^{-15}}", False, "closeness"),
]
