"""Labelled grading cases for the ways a response phrases a right answer that a strict reader
misses, and for the unit traps a lenient reader falls into. Shared by
tests/envs/test_envs_grading_phrasings.py and scripts/bench_grading.py.

Each case is (gold, response, label, kind), written here for these kinds (not copied from any
suite), with at least as many not-equal pairs as equal pairs per kind. The label is what a careful
human grader says about the mathematics. The kinds:
- template_tail: a final answer followed by chat-template or turn text (a hallucinated next turn);
- minerva_line: "Final Answer: The final answer is $X$. I hope it is correct.";
- glued_unit: a number with a currency sign or a unit glued on, in prose;
- solution_set: unordered solution sets in another order or with other separators, `(0;1;2)`
  tuples, several boxes forming the set, `\\pm 7` against `\\{-7, 7\\}`;
- formula: commutativity inside a formula, a stated equation whose right side is the answer
  (`\\det M = 3`), a matrix sum to evaluate;
- damaged_box: `boxed {77}`, `\\beginboxed{...}`, a box glyph before braces, a bare number alone on
  the last line, an option letter stated in prose;
- calculus: identities and calculus results in sympy or LaTeX form;
- unit_trap: the same number with another unit prefix or another quantity (never equal), a percent
  against a number (the documented convention: a percent equals the number it writes and the
  rate it names, nothing else).

The first 158 cases were graded once before the rules for these kinds were written: builtin
107/158 with 14 false positives, math-verify 115/158 with 18. They were then used to develop those
rules, so a score on them is no independent one; the later cases (after the 158th) are traps
added while developing (a subscript "n+1" read as "n-1", a unit in words in prose).
"""

CASES: list[tuple[str, str, bool, str]] = [
    # ---- template_tail
    (
        "\\frac{2}{3}",
        "Counting the outcomes, so the probability is 2/3. <|im_start|>user\nThanks!",
        True,
        "template_tail",
    ),
    (
        "\\frac{3}{4}",
        "Counting the outcomes, so the probability is 2/3. <|im_start|>user\nThanks!",
        False,
        "template_tail",
    ),
    ("(4,1)", "Solving both equations, the intersection is $(4, 1)$. <|im_end|>", True, "template_tail"),
    ("(4,1)", "Solving both equations, the intersection is $(1, 4)$. <|im_end|>", False, "template_tail"),
    (
        "18",
        "Thus the total is \\boxed{18}.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nNow double it."
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nDoubling gives \\boxed{36}.",
        True,
        "template_tail",
    ),
    (
        "36",
        "Thus the total is \\boxed{18}.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nNow double it."
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nDoubling gives \\boxed{36}.",
        False,
        "template_tail",
    ),
    (
        "7",
        "So the answer is $7$.<end_of_turn>\n<start_of_turn>user\nAnd with 8 coins?<end_of_turn>\n"
        "<start_of_turn>model\nThen the answer is $8$.",
        True,
        "template_tail",
    ),
    (
        "8",
        "So the answer is $7$.<end_of_turn>\n<start_of_turn>user\nAnd with 8 coins?<end_of_turn>\n"
        "<start_of_turn>model\nThen the answer is $8$.",
        False,
        "template_tail",
    ),
    (
        "12",
        "Adding both parts gives \\boxed{12}<｜end▁of▁sentence｜><｜User｜>Again<｜Assistant｜>\\boxed{13}",
        True,
        "template_tail",
    ),
    (
        "13",
        "Adding both parts gives \\boxed{12}<｜end▁of▁sentence｜><｜User｜>Again<｜Assistant｜>\\boxed{13}",
        False,
        "template_tail",
    ),
    (
        "5",
        "Substituting back, the equation holds, so x = 5.\n\nUser: Can you check x = 6?\nAssistant: With x = 6 "
        "it also works, so the answer is 6.",
        True,
        "template_tail",
    ),
    (
        "6",
        "Substituting back, the equation holds, so x = 5.\n\nUser: Can you check x = 6?\nAssistant: With x = 6 "
        "it also works, so the answer is 6.",
        False,
        "template_tail",
    ),
    (
        "\\frac{1}{4}",
        "The ratio of the areas is $\\frac{1}{4}$.</s><s>[INST] Next one [/INST] The answer is $\\frac{1}{2}$.",
        True,
        "template_tail",
    ),
    (
        "\\frac{1}{2}",
        "The ratio of the areas is $\\frac{1}{4}$.</s><s>[INST] Next one [/INST] The answer is $\\frac{1}{2}$.",
        False,
        "template_tail",
    ),
    (
        "9",
        "Therefore, the final answer is 9.\n\nHuman: What is 3 + 3?\n\nAssistant: The final answer is 6.",
        True,
        "template_tail",
    ),
    (
        "6",
        "Therefore, the final answer is 9.\n\nHuman: What is 3 + 3?\n\nAssistant: The final answer is 6.",
        False,
        "template_tail",
    ),
    ("2", "The answer is $2$.\n<|user|>\nWhy?\n<|assistant|>\nSorry, the answer is $3$.", True, "template_tail"),
    ("3", "The answer is $2$.\n<|user|>\nWhy?\n<|assistant|>\nSorry, the answer is $3$.", False, "template_tail"),
    ("4", "<|im_start|>assistant\nI need more information to answer.<|im_end|>", False, "template_tail"),
    # ---- minerva_line
    ("12340", "Final Answer: The final answer is $12,340$. I hope it is correct.", True, "minerva_line"),
    ("12340", "Final Answer: The final answer is $12,430$. I hope it is correct.", False, "minerva_line"),
    (
        "2.5",
        "The time is t = d/v = 2.5 s.\nFinal Answer: The final answer is 2.5. I hope it is correct.",
        True,
        "minerva_line",
    ),
    (
        "2.5",
        "The time is t = 25 s.\nFinal Answer: The final answer is 25. I hope it is correct.",
        False,
        "minerva_line",
    ),
    (
        "\\frac{\\sqrt{3}}{2}",
        "Final Answer: The final answer is $\\frac{\\sqrt{3}}{2}$. I hope it is correct.",
        True,
        "minerva_line",
    ),
    (
        "\\frac{\\sqrt{3}}{2}",
        "Final Answer: The final answer is $\\frac{\\sqrt{2}}{2}$. I hope it is correct.",
        False,
        "minerva_line",
    ),
    ("x^2+2x+1", "Final Answer: The final answer is $x^2 + 2x + 1$. I hope it is correct.", True, "minerva_line"),
    ("x^2+2x+1", "Final Answer: The final answer is $x^2 + 2x - 1$. I hope it is correct.", False, "minerva_line"),
    (
        "-3",
        "We get x = -3.\n\nFinal Answer: The final answer is $-3$. I hope it is correct.<|im_end|>",
        True,
        "minerva_line",
    ),
    (
        "3",
        "We get x = -3.\n\nFinal Answer: The final answer is $-3$. I hope it is correct.<|im_end|>",
        False,
        "minerva_line",
    ),
    ("\\frac{7}{2}", "Final Answer: The final answer is 7/2. I hope it is correct.", True, "minerva_line"),
    ("\\frac{7}{2}", "Final Answer: The final answer is 2/7. I hope it is correct.", False, "minerva_line"),
    (
        "1.5 \\times 10^{-3}",
        "Final Answer: The final answer is $1.5 \\times 10^{-3}$. I hope it is correct.",
        True,
        "minerva_line",
    ),
    (
        "1.5 \\times 10^{-3}",
        "Final Answer: The final answer is $1.5 \\times 10^{3}$. I hope it is correct.",
        False,
        "minerva_line",
    ),
    ("45", "Final Answer: The final answer is $\\boxed{45}$. I hope it is correct.", True, "minerva_line"),
    ("45", "Final Answer: The final answer is $\\boxed{54}$. I hope it is correct.", False, "minerva_line"),
    ("0.8", "Final Answer: The final answer is 0.8 \\mathrm{~V}. I hope it is correct.", True, "minerva_line"),
    ("0.8", "Final Answer: The final answer is 8 \\mathrm{~V}. I hope it is correct.", False, "minerva_line"),
    ("4", "Final Answer: The final answer is 4.I hope it is correct.", True, "minerva_line"),
    ("4", "Final Answer: The final answer is 14.I hope it is correct.", False, "minerva_line"),
    # ---- glued_unit
    ("2500.75", "Adding the fees to the base price, the bill comes to 2,500.75€.", True, "glued_unit"),
    ("2500.75", "Adding the fees to the base price, the bill comes to 2,050.75€.", False, "glued_unit"),
    ("3.5", "The rectangle has an area of 3.5m².", True, "glued_unit"),
    ("35", "The rectangle has an area of 3.5m².", False, "glued_unit"),
    ("18", "Splitting the load evenly, so each box weighs 18kg.", True, "glued_unit"),
    ("18", "Splitting the load evenly, so each box weighs 81kg.", False, "glued_unit"),
    ("60", "Dividing distance by time, therefore the car travels at 60km/h.", True, "glued_unit"),
    ("50", "Dividing distance by time, therefore the car travels at 60km/h.", False, "glued_unit"),
    ("12.5", "Thus the final length of the rod is 12.5cm.", True, "glued_unit"),
    ("125", "Thus the final length of the rod is 12.5cm.", False, "glued_unit"),
    ("7.2", "So the answer is 7.2m/s.", True, "glued_unit"),
    ("72", "So the answer is 7.2m/s.", False, "glued_unit"),
    ("1200", "So the trip costs 1,200USD in total.", True, "glued_unit"),
    ("1200", "So the trip costs 1,020USD in total.", False, "glued_unit"),
    ("350", "Hence he earned ¥350 that week.", True, "glued_unit"),
    ("305", "Hence he earned ¥350 that week.", False, "glued_unit"),
    ("45", "In total, she spends $45.", True, "glued_unit"),
    ("54", "In total, she spends $45.", False, "glued_unit"),
    ("2", "The tank drains in 2h, and I am not sure about the rest.", False, "glued_unit"),
    # ---- solution_set
    ("(2,1,3),(1,2,3)", "The solutions are \\boxed{(1,2,3),(2,1,3)}", True, "solution_set"),
    ("(2,1,3),(1,2,3)", "The solutions are \\boxed{(1,2,3),(3,1,2)}", False, "solution_set"),
    ("(0,1,2)", "The only triple is \\boxed{(0;1;2)}.", True, "solution_set"),
    ("(0,1,2)", "The only triple is \\boxed{(0;2;1)}.", False, "solution_set"),
    ("\\{2,5\\}", "The roots are \\boxed{2}, \\boxed{5}", True, "solution_set"),
    ("\\{2,5\\}", "The roots are \\boxed{2}, \\boxed{6}", False, "solution_set"),
    ("1,4", "So $x = \\boxed{1}$ and $x = \\boxed{4}$.", True, "solution_set"),
    ("1,4", "So $x = \\boxed{1}$ and $x = \\boxed{5}$.", False, "solution_set"),
    ("\\{-7,7\\}", "Taking square roots, $x = \\boxed{\\pm 7}$.", True, "solution_set"),
    ("\\{-7,7\\}", "Taking square roots, $x = \\boxed{7}$.", False, "solution_set"),
    ("\\pm 7", "The solutions are \\boxed{\\{-7, 7\\}}.", True, "solution_set"),
    ("\\pm 7", "The solutions are \\boxed{\\{-7, 0, 7\\}}.", False, "solution_set"),
    ("-7,7", "So $x = ±7$ is the answer.", True, "solution_set"),
    ("-7,7", "So $x = ±8$ is the answer.", False, "solution_set"),
    ("\\{1,2,3\\}", "The answer is \\boxed{\\{3; 1; 2\\}}", True, "solution_set"),
    ("\\{1,2,3\\}", "The answer is \\boxed{\\{3; 1; 4\\}}", False, "solution_set"),
    (
        "\\{-1,3\\}",
        "The first root is \\boxed{-1}. The second root is \\boxed{3}.",
        True,
        "solution_set",
    ),
    (
        "\\{-1,3\\}",
        "I first guessed \\boxed{-1}, then \\boxed{3}, but in the end the answer is \\boxed{5}.",
        False,
        "solution_set",
    ),
    ("(1,2)", "The ordered pair is \\boxed{(2,1)}.", False, "solution_set"),
    ("(1,2)", "The ordered pair is \\boxed{(1;2)}.", True, "solution_set"),
    ("\\{2,5\\}", "The roots are \\boxed{2}, \\boxed{5}, \\boxed{7}", False, "solution_set"),
    # ---- formula
    (
        "\\sum_{k=0}^{n} a_k b_{n-k}",
        "The coefficient is $\\boxed{\\sum_{k=0}^{n} b_{n-k} a_k}$.",
        True,
        "formula",
    ),
    (
        "\\sum_{k=0}^{n} a_k b_{n-k}",
        "The coefficient is $\\boxed{\\sum_{k=0}^{n} a_k b_{k}}$.",
        False,
        "formula",
    ),
    ("a_k b_{n-k}", "\\boxed{b_{n-k} a_k}", True, "formula"),
    ("a_k b_{n-k}", "\\boxed{b_{n-k} a_{k+1}}", False, "formula"),
    ("3", "Expanding along the first row, $\\boxed{\\det M = 3}$.", True, "formula"),
    ("3", "Expanding along the first row, $\\boxed{\\det M = -3}$.", False, "formula"),
    ("1", "Using the standard limit, $\\boxed{\\lim_{x\\to0} \\frac{\\sin x}{x} = 1}$.", True, "formula"),
    ("0", "Using the standard limit, $\\boxed{\\lim_{x\\to0} \\frac{\\sin x}{x} = 1}$.", False, "formula"),
    ("\\frac{1}{3}", "So $\\int_0^1 x^2\\,dx = \\frac{1}{3}$.", True, "formula"),
    ("\\frac{1}{2}", "So $\\int_0^1 x^2\\,dx = \\frac{1}{3}$.", False, "formula"),
    (
        "\\begin{pmatrix}3&4\\\\5&6\\end{pmatrix}",
        "\\boxed{\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}+\\begin{pmatrix}2&2\\\\2&2\\end{pmatrix}}",
        True,
        "formula",
    ),
    (
        "\\begin{pmatrix}3&4\\\\5&6\\end{pmatrix}",
        "\\boxed{\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}+\\begin{pmatrix}2&2\\\\2&3\\end{pmatrix}}",
        False,
        "formula",
    ),
    (
        "\\begin{pmatrix}1&1\\\\1&1\\end{pmatrix}",
        "\\boxed{\\begin{pmatrix}3&4\\\\5&6\\end{pmatrix}-\\begin{pmatrix}2&3\\\\4&5\\end{pmatrix}}",
        True,
        "formula",
    ),
    (
        "\\begin{pmatrix}1&1\\\\1&1\\end{pmatrix}",
        "\\boxed{\\begin{pmatrix}3&4\\\\5&6\\end{pmatrix}+\\begin{pmatrix}2&3\\\\4&5\\end{pmatrix}}",
        False,
        "formula",
    ),
    ("xy+2z", "\\boxed{2z + yx}", True, "formula"),
    ("xy+2z", "\\boxed{2y + zx}", False, "formula"),
    ("6", "The determinant is computed as $\\boxed{x + 1 = 6}$.", False, "formula"),
    # ---- damaged_box
    ("77", "Adding everything up, the answer is boxed {77}.", True, "damaged_box"),
    ("77", "Adding everything up, the answer is boxed {71}.", False, "damaged_box"),
    ("42", "After simplification we obtain \\beginboxed{42}.", True, "damaged_box"),
    ("42", "After simplification we obtain \\beginboxed{24}.", False, "damaged_box"),
    ("15", "So the number of handshakes is □{15}.", True, "damaged_box"),
    ("15", "So the number of handshakes is □{16}.", False, "damaged_box"),
    (
        "105",
        "First we count the pairs: 15 of them.\nEach pair gives 7 arrangements, so 15 times 7.\n\n105",
        True,
        "damaged_box",
    ),
    (
        "107",
        "First we count the pairs: 15 of them.\nEach pair gives 7 arrangements, so 15 times 7.\n\n105",
        False,
        "damaged_box",
    ),
    ("C", "Comparing the four graphs with the slope we found, so the answer is (C).", True, "damaged_box"),
    ("D", "Comparing the four graphs with the slope we found, so the answer is (C).", False, "damaged_box"),
    ("B", "Option A fails at x = 0 and option C is too large. I think it's B.", True, "damaged_box"),
    ("A", "Option A fails at x = 0 and option C is too large. I think it's B.", False, "damaged_box"),
    ("B", "Options A, C and D all contradict the second condition, so I'd go with B.", True, "damaged_box"),
    ("B", "It is not B, since B fails at x = 0. So I choose D.", False, "damaged_box"),
    ("B", "Maybe it's B, but I cannot verify it.", False, "damaged_box"),
    ("12", "We need the smallest value.\nSo far the candidates are 12 and 18.\n\n3.", False, "damaged_box"),
    ("42", "The answer is \\boxed 42.", True, "damaged_box"),
    ("42", "The answer is \\boxed 24.", False, "damaged_box"),
    # ---- calculus
    ("1", "\\boxed{sin(x)**2+cos(x)**2}", True, "calculus"),
    ("1", "\\boxed{sin(x)**2-cos(x)**2}", False, "calculus"),
    ("3x^2", "Differentiating term by term, $\\boxed{\\frac{d}{dx}x^3 = 3x^2}$.", True, "calculus"),
    ("3x^3", "Differentiating term by term, $\\boxed{\\frac{d}{dx}x^3 = 3x^2}$.", False, "calculus"),
    ("\\frac{1}{n+1}", "\\boxed{factorial(n)/factorial(n+1)}", True, "calculus"),
    ("\\frac{1}{n}", "\\boxed{factorial(n)/factorial(n+1)}", False, "calculus"),
    ("1", "\\boxed{\\sin^2\\theta + \\cos^2\\theta}", True, "calculus"),
    ("2", "\\boxed{\\sin^2\\theta + \\cos^2\\theta}", False, "calculus"),
    ("\\frac{x^3}{3}+C", "Integrating, $\\boxed{\\int x^2\\,dx = \\frac{x^3}{3} + C}$.", True, "calculus"),
    ("\\frac{x^3}{3}+C", "Integrating, $\\boxed{\\int x^2\\,dx = \\frac{x^2}{2} + C}$.", False, "calculus"),
    ("2\\cos(2x)", "\\boxed{2*cos(2*x)}", True, "calculus"),
    ("2\\cos(2x)", "\\boxed{2*cos(x)**2}", False, "calculus"),
    ("e^{2x}", "\\boxed{exp(2*x)}", True, "calculus"),
    ("e^{2x}", "\\boxed{exp(x)**3}", False, "calculus"),
    ("\\frac{\\sqrt{2}}{2}", "\\boxed{sqrt(2)/2}", True, "calculus"),
    ("\\frac{\\sqrt{2}}{2}", "\\boxed{sqrt(3)/2}", False, "calculus"),
    ("\\frac{n(n+1)}{2}", "\\boxed{\\sum_{k=1}^{n} k = \\frac{n(n+1)}{2}}", True, "calculus"),
    ("\\frac{n(n-1)}{2}", "\\boxed{\\sum_{k=1}^{n} k = \\frac{n(n+1)}{2}}", False, "calculus"),
    ("2\\sin x\\cos x", "\\boxed{sin(2*x)}", True, "calculus"),
    ("2\\sin x\\cos x", "\\boxed{sin(x)*cos(2*x)}", False, "calculus"),
    # ---- unit_trap
    ("10 m", "\\boxed{10 \\text{ cm}}", False, "unit_trap"),
    ("10 m", "\\boxed{10 \\text{ m}}", True, "unit_trap"),
    ("10 m", "\\boxed{1000 \\text{ cm}}", True, "unit_trap"),
    ("5 kg", "\\boxed{5 \\text{ g}}", False, "unit_trap"),
    ("5 kg", "\\boxed{5000 \\text{ g}}", True, "unit_trap"),
    ("5\\text{ kg}", "So the mass is 5g.", False, "unit_trap"),
    ("3 \\text{ km}", "\\boxed{3 \\text{ mm}}", False, "unit_trap"),
    ("3 \\text{ km}", "\\boxed{3000\\,\\mathrm{m}}", True, "unit_trap"),
    ("2 hours", "\\boxed{2 \\text{ minutes}}", False, "unit_trap"),
    ("2 hours", "\\boxed{120 \\text{ minutes}}", True, "unit_trap"),
    ("10 m", "\\boxed{10 \\text{ s}}", False, "unit_trap"),
    ("12 \\text{ cm}^2", "\\boxed{12 \\text{ cm}}", False, "unit_trap"),
    ("12 \\text{ cm}^2", "\\boxed{1200 \\text{ mm}^2}", True, "unit_trap"),
    ("100 \\text{ cm}^2", "\\boxed{100 \\text{ m}^2}", False, "unit_trap"),
    ("5 \\text{ dollars}", "\\boxed{5 \\text{ cents}}", False, "unit_trap"),
    ("0.25", "\\boxed{25}", False, "unit_trap"),
    ("25\\%", "\\boxed{0.25}", True, "unit_trap"),
    ("25\\%", "\\boxed{25}", True, "unit_trap"),
    ("25\\%", "\\boxed{2.5}", False, "unit_trap"),
    ("0.25", "\\boxed{2.5\\%}", False, "unit_trap"),
    ("36 km/h", "\\boxed{10 \\text{ m/s}}", True, "unit_trap"),
    ("36 km/h", "\\boxed{36 \\text{ m/s}}", False, "unit_trap"),
    ("12", "\\boxed{12 \\text{ cm}}", True, "unit_trap"),
    ("7 \\text{ cm}", "\\boxed{7}", True, "unit_trap"),
    # ---- traps added while developing the rules above
    ("a_{n+1}", "\\boxed{a_{n-1}}", False, "formula"),
    ("\\sin x \\cos y", "\\boxed{\\cos x \\sin y}", False, "formula"),
    ("x^2 y", "\\boxed{y^2 x}", False, "formula"),
    ("x^2 y", "\\boxed{y x^2}", True, "formula"),
    ("3 \\text{ ft}", "\\boxed{36 \\text{ in}}", True, "unit_trap"),
    ("3 \\text{ ft}", "\\boxed{3 \\text{ in}}", False, "unit_trap"),
    ("250 \\text{ mL}", "\\boxed{0.25 \\text{ L}}", True, "unit_trap"),
    ("250 \\text{ mL}", "\\boxed{250 \\text{ L}}", False, "unit_trap"),
    ("40\\%", "\\boxed{0.4}", True, "unit_trap"),
    ("40\\%", "\\boxed{4}", False, "unit_trap"),
    ("1.5 \\text{ hours}", "\\boxed{90 \\text{ minutes}}", True, "unit_trap"),
    ("1.5 \\text{ hours}", "\\boxed{1.5 \\text{ minutes}}", False, "unit_trap"),
    ("5 \\text{ km}", "Walking along the river, the distance is 5 miles.", False, "unit_trap"),
    ("5 \\text{ km}", "Walking along the river, the distance is 5 km.", True, "unit_trap"),
    ("4", "So the answer is 4 in total.", True, "glued_unit"),
    ("14", "So the answer is 4 in total.", False, "glued_unit"),
    ("\\{2,5\\}", "So \\boxed{2}. Wait, that is wrong: \\boxed{5}.", False, "solution_set"),
    ("\\int_0^1 f(x)\\,dx", "\\boxed{\\int_0^1 f(x)\\,dx}", True, "calculus"),
    ("\\int_0^1 f(x)\\,dx", "\\boxed{\\int_0^2 f(x)\\,dx}", False, "calculus"),
]
