"""`builtin`: a small prompt set written for this project (chat, code, math, summarisation; five of the
sixteen are multi-turn), so the harness runs with nothing downloaded.
"""

from __future__ import annotations

from graft.data.prompt import Prompt

_PASSAGE_TIDES = (
    "Tides are the regular rise and fall of the sea. They are caused mainly by the Moon's gravity, which "
    "pulls the ocean on the side of the Earth facing it slightly more than the Earth itself, and pulls the "
    "Earth slightly more than the ocean on the far side. The result is two bulges of water, so most coasts "
    "see two high tides and two low tides each day. When the Sun and Moon line up, at new and full moon, "
    "their pulls add and the tides are larger; these are called spring tides. When they are at right "
    "angles, the tides are smaller, and these are called neap tides."
)
_PASSAGE_LIBRARY = (
    "The town council met on Tuesday to discuss the future of the public library. The building, opened in "
    "1962, needs a new roof and its heating system fails most winters. One proposal is to repair the old "
    "building for about two million dollars. A second is to move the library into the empty department "
    "store on Main Street, which would cost more at first but offer twice the space and a room for "
    "community events. Several residents spoke in favour of keeping the original building because of its "
    "history. The council will vote on the two options next month after an engineer's report."
)
_PASSAGE_BEES = (
    "Honey bees communicate the location of food through a movement known as the waggle dance. A forager "
    "returning to the hive runs in a straight line while shaking her body, then circles back and repeats. "
    "The angle of the straight run relative to vertical tells the other bees the direction of the food "
    "relative to the Sun, and the length of the run tells them the distance. Bees that follow the dance "
    "can then fly directly to flowers more than a kilometre away."
)
_CODE_SNIPPET = (
    "def average(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n"
)

BUILTIN: list[Prompt] = [
    Prompt("chat-1", "chat", ["Give me three tips for staying focused while working from home."]),
    Prompt(
        "chat-2",
        "chat",
        [
            "I am planning a weekend trip to a city I have never visited. What should I pack?",
            "Now turn that into a short checklist I can print.",
        ],
    ),
    Prompt("chat-3", "chat", ["Write a short, friendly email inviting my team to a lunch on Friday."]),
    Prompt(
        "chat-4",
        "chat",
        [
            "Explain what a rainbow is to a ten-year-old.",
            "Now explain it again in one sentence.",
        ],
    ),
    Prompt(
        "code-1",
        "code",
        ["Write a Python function that checks whether a string is a palindrome, ignoring case and spaces."],
    ),
    Prompt(
        "code-2",
        "code",
        [
            "Write a Python function `fizzbuzz(n)` that returns a list of strings for the numbers 1 to n.",
            "Add a docstring and two example calls to the function you wrote.",
        ],
    ),
    Prompt(
        "code-3",
        "code",
        [
            "Here is a Python function:\n\n"
            + _CODE_SNIPPET
            + "\nWhat happens if the list is empty? Rewrite it to handle that case."
        ],
    ),
    Prompt(
        "code-4",
        "code",
        [
            "Write a SQL query that returns the five customers with the highest total order amount from tables customers(id, name) and orders(id, customer_id, amount)."
        ],
    ),
    Prompt(
        "math-1", "math", ["A shop sells pencils at 3 for 75 cents. How much do 12 pencils cost? Explain step by step."]
    ),
    Prompt(
        "math-2",
        "math",
        [
            "Tom has 5 apples. He buys 2 bags with 6 apples each and gives 4 apples to his sister. How many apples does he have now?",
            "If he then eats one apple a day, how many days will the apples last?",
        ],
    ),
    Prompt("math-3", "math", ["What is 15% of 240? Show your working."]),
    Prompt(
        "math-4",
        "math",
        ["A train travels 180 kilometres in 2 hours and 30 minutes. What is its average speed in kilometres per hour?"],
    ),
    Prompt("sum-1", "summarisation", ["Summarise the following passage in two sentences.\n\n" + _PASSAGE_TIDES]),
    Prompt(
        "sum-2",
        "summarisation",
        [
            "Summarise this news report in three bullet points.\n\n" + _PASSAGE_LIBRARY,
            "Which option do you think the council should choose, and why?",
        ],
    ),
    Prompt("sum-3", "summarisation", ["Give a one-paragraph summary of this text.\n\n" + _PASSAGE_BEES]),
    Prompt("sum-4", "summarisation", ["Read the passage and list its key facts.\n\n" + _PASSAGE_TIDES]),
]
