"""The requests a target answers to make its own training data: composed for this project, none from an
evaluation set. Topic, template, code and passage lists, and the order the generate stage takes them in
(graft/train/generate.py); ids depend on that order, so lists only ever grow at their end.
"""

from __future__ import annotations

import random

TOPICS = [
    "cooking",
    "gardening",
    "personal finance",
    "history of science",
    "astronomy",
    "learning a language",
    "running",
    "photography",
    "climate",
    "sleep",
    "job interviews",
    "writing fiction",
    "electric cars",
    "birds",
    "chess",
    "budget travel",
    "ancient Rome",
    "volcanoes",
    "the human heart",
    "recycling",
    "music theory",
    "coffee",
    "time management",
    "dogs",
    "oceans",
    "bicycles",
    "public speaking",
    "painting",
    "the internet",
    "renting a flat",
    "first aid",
    "board games",
    "mountains",
    "tea",
    "saving energy at home",
    "friendship",
    "mathematics puzzles",
    "trains",
    "weather forecasts",
    "bread",
]
# Round 6 of the block drafter (issue 16): forty more everyday topics, crossed with TEMPLATES and PASSAGES
# into requests appended after the earlier ones (templated_requests, passage_groups), so earlier ids keep
# their texts. None echoes a prompt of an evaluation set.
TOPICS_MORE = [
    "museums",
    "camping",
    "knitting",
    "the solar system",
    "video games",
    "yoga",
    "city parks",
    "jazz",
    "architecture",
    "cats",
    "swimming",
    "podcasts",
    "farming",
    "rivers",
    "deserts",
    "the printing press",
    "smartphones",
    "composting",
    "origami",
    "dinosaurs",
    "solar panels",
    "vaccines",
    "public transport",
    "football",
    "baking cakes",
    "meditation",
    "learning to code",
    "volunteering",
    "robots",
    "ancient Egypt",
    "forests",
    "caves",
    "kites",
    "the Olympic Games",
    "cheese",
    "airplanes",
    "lighthouses",
    "nutrition",
    "birthday parties",
    "snow",
]
COMPOSED = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python class for a simple bank account with deposit and withdraw methods.",
    "Explain the difference between a list and a tuple in Python, with examples.",
    "Write a JavaScript function that removes duplicates from an array.",
    "Write a short poem about autumn leaves.",
    "Write a short story about a robot who learns to paint.",
    "Describe your ideal weekend in a few paragraphs.",
    "Write a Python function that counts the words in a text file.",
    "Explain recursion to a beginner programmer.",
    "Write a SQL query that lists all employees hired after 2020 from a table employees(name, hire_date).",
    "Write a letter to a neighbour asking them to water your plants while you travel.",
    "Explain how a refrigerator keeps food cold.",
    "Write a Python function that checks whether a number is prime.",
    "Summarise the plot of a detective story you invent, in one paragraph.",
    "List five tips for writing clear emails and explain each.",
    "Write a bash command that finds all .txt files in a folder and counts their lines.",
    "Explain what a hash table is and why lookups are fast.",
    "Write a product description for a reusable water bottle.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Describe how plants make food from sunlight.",
]

# Request shapes composed for this project, crossed with TOPICS: prose, lists, explanation, role-play,
# letters, comparison and code-adjacent answers, the kinds of turns a chat assistant writes.
TEMPLATES = [
    "Write a short essay about {t}.",
    "Explain {t} to a ten-year-old.",
    "Give five practical tips about {t}, with one sentence on each.",
    "Write a short poem about {t}.",
    "What are the most common mistakes beginners make with {t}, and how can they avoid them?",
    "Write an email to a friend inviting them to try {t} with you.",
    "Pretend you are a guide who knows everything about {t}. Introduce yourself and the subject.",
    "Compare two different approaches to {t} and say which you would recommend.",
    "Summarise the history of {t} in a few paragraphs.",
    "Write a step-by-step plan for someone who wants to get better at {t} in one month.",
    # round 4: more writing and role-play shapes
    "Write a persuasive blog post about {t}.",
    "You are a well-known expert on {t} opening a public talk. Write the first part of your speech.",
    "Write a short dialogue between two friends who disagree about {t}.",
    "Describe a day in the life of someone whose job involves {t}.",
    "Write a short newsletter for a local club about {t}.",
    "Answer in the voice of a cheerful pirate: what do you think of {t}?",
    "Write a review of an imaginary book about {t}.",
    "Create a three-question quiz about {t} and give the answers.",
    "Write a short story in which {t} changes someone's life.",
    "Write a social media post that gets people interested in {t}.",
]

# Second turns composed for this project: the follow-ups a chat user sends after a first answer
# (rewrite, shorten, restyle, extend, critique), so that the head also sees turns that lean on context.
FOLLOWUPS = [
    "Rewrite your previous answer in a more formal tone.",
    "Summarise your answer in three bullet points.",
    "Make your answer half as long, keeping the key points.",
    "Now explain the same thing to a five-year-old.",
    "Add a concrete example to your answer.",
    "Turn your answer into a short poem.",
    "What are the weaknesses of what you just wrote? Then give an improved version.",
    "Rewrite your answer as a dialogue between a teacher and a student.",
    "Give your answer a title and write a one-sentence summary of it.",
    "Continue from where you stopped, adding two more ideas.",
    "Rewrite your answer so that it would fit in a short text message.",
    "Now argue the opposite point of view.",
]
# Single turns that paste one of the target's own first answers back with a request to rework it: the
# summarise / restate / explain-this-text turns of chat benchmarks, where the answer leans on the prompt.
REWORKS = [
    "Summarise the following text in two or three sentences.\n\n{text}",
    "List the main points of this text as bullet points.\n\n{text}",
    "Give this text a title and explain its main idea in one paragraph.\n\n{text}",
    "Rewrite the following text in simpler words.\n\n{text}",
]


# Programming tasks composed for this project (round 5 of the data), crossed with CODE_SHAPES: the code
# turns of chat benchmarks, where answers are mostly code whose next token follows from the prompt.
CODE_TASKS = [
    "reverses the order of the words in a sentence",
    "returns the largest number in a list without using max",
    "counts how many vowels a string contains",
    "removes every duplicate from a list while keeping the original order",
    "returns the factorial of n",
    "checks whether two strings are anagrams of each other",
    "converts a temperature from Celsius to Fahrenheit",
    "returns the second smallest number in a list",
    "flattens a list of lists into one list",
    "counts how often each word appears in a text and returns a dictionary",
    "returns the sum of the digits of an integer",
    "checks whether a year is a leap year",
    "finds the longest word in a sentence",
    "returns the greatest common divisor of two integers",
    "splits a list into chunks of a given size",
    "capitalises the first letter of every word in a string",
    "returns all the even numbers from a list",
    "computes the average of a list of numbers",
    "checks whether a list is sorted in ascending order",
    "converts a binary string to an integer",
    "returns the n-th row of Pascal's triangle",
    "finds the index of a value in a sorted list using binary search",
    "rotates a list to the right by k positions",
    "returns the intersection of two lists",
    "checks whether a string contains balanced parentheses",
    "converts a Roman numeral to an integer",
    "returns the median of a list of numbers",
    "counts the lines, words and characters of a text",
    "transposes a matrix given as a list of lists",
    "returns the most common element of a list",
    "merges two dictionaries, adding the values of keys they share",
    "removes all punctuation from a string",
    "generates the first n prime numbers",
    "checks whether a number is a perfect square",
    "returns a list of the running totals of a list",
    "sorts a list of dictionaries by the value of a given key",
    "compresses a string by replacing repeated characters with a count, so aaabb becomes a3b2",
    "checks whether an email address has a valid basic format",
    "returns the number of days between two dates",
    "finds all pairs of numbers in a list that add up to a target",
]
CODE_SHAPES = [
    "Write a Python function that {t}.",
    "Write a Python function that {t}. Explain how it works.",
    "Write a JavaScript function that {t}.",
    "Write a Python function that {t}, with a docstring and type hints.",
    "How would you write a function that {t}? Show the code in Python.",
]
SQL_TASKS = [
    "returns the ten most expensive products from a table products(id, name, price)",
    "counts the orders per customer from a table orders(id, customer_id, total)",
    "lists the students whose average grade is above 80 from a table grades(student_id, course, grade)",
    "finds the employees who earn more than their manager from a table employees(id, name, salary, manager_id)",
    "returns the total sales per month from a table sales(id, sold_at, amount)",
    "lists the books that have never been borrowed from tables books(id, title) and loans(id, book_id, loaned_at)",
    "deletes the duplicate rows of a table emails(id, address), keeping the lowest id",
    "returns the three cities with the most customers from a table customers(id, name, city)",
]
# More programming tasks (round 5 of the block drafter's data), shuffled after the first ones, so that the
# ids of earlier rounds' code turns keep their text.
CODE_TASKS_MORE = [
    "returns the n-th Fibonacci number",
    "checks whether a string is a palindrome, ignoring spaces and case",
    "converts an integer to its binary representation as a string",
    "returns the minimum and maximum of a list in one pass",
    "removes all whitespace from a string",
    "returns the product of all the numbers in a list",
    "checks whether a number is prime",
    "reverses a string without using slicing",
    "returns the keys of a dictionary sorted by their values",
    "counts the uppercase and lowercase letters in a string",
    "returns the cumulative product of a list",
    "groups a list of words by their first letter",
    "returns the difference between the largest and smallest values in a list",
    "checks whether all the elements of a list are unique",
    "converts a string in snake_case to camelCase",
    "returns the k largest numbers of a list in descending order",
    "computes the dot product of two vectors given as lists",
    "returns every substring of a string that is a palindrome",
    "shuffles a list in place using the Fisher-Yates algorithm",
    "returns the number of set bits in an integer",
    "checks whether a string is a valid IPv4 address",
    "merges two sorted lists into one sorted list",
    "returns the first character of a string that does not repeat",
    "computes the area of a circle, a rectangle or a triangle depending on its arguments",
    "returns the sum of all the multiples of 3 or 5 below n",
    "converts a list of pairs into a dictionary",
    "finds the missing number in a list containing 1 to n with one number missing",
    "returns the length of the longest run of equal elements in a list",
    "validates that a password has at least eight characters, a digit and an uppercase letter",
    "returns the words of a sentence sorted by length",
    "counts the number of islands in a grid of zeros and ones",
    "converts a number of seconds into hours, minutes and seconds",
    "returns a new list with every element of a list squared",
    "finds the common prefix of a list of strings",
    "implements a stack with push, pop and peek",
    "checks whether one string is a rotation of another",
    "returns the mean, median and mode of a list of numbers",
    "removes the vowels from a string",
    "returns the sum of the elements on the main diagonal of a square matrix",
    "finds the second largest word in a sentence by length",
]
# Second turns after the target's own code (composed for this project).
CODE_FOLLOWUPS = [
    "Add comments that explain each step of your code.",
    "Write three unit tests for your function.",
    "Make your function handle invalid input, and explain what you changed.",
    "Show two example calls to your function and what they return.",
    "Rewrite your function so that it is shorter.",
    "What is the time complexity of your solution? Can it be improved?",
    "Now write the same function in JavaScript.",
    "Add type hints to your function and describe its parameters.",
]
# Single turns that paste the target's own code back (the first fenced block of one of its answers).
CODE_REVIEWS = [
    "Here is a piece of code:\n\n{code}\n\nExplain what it does, step by step.",
    "Here is some code:\n\n{code}\n\nDoes it have any bugs or missed edge cases? Rewrite it to fix them.",
    "Add comments to this code:\n\n{code}",
    "What happens if this function gets unusual input?\n\n{code}\n\nImprove it so that it handles such input.",
]
# Passages the target writes itself, then pasted into summarising and fact-listing turns (SUMMARIES):
# the summarisation turns of chat benchmarks, where the answer copies and condenses the prompt.
PASSAGES = [
    "Write a short factual paragraph about {t}.",
    "Write a short news report about a local event related to {t}.",
    "Write an informative paragraph explaining one surprising fact about {t}.",
]
SUMMARIES = [
    "Summarise this passage in one sentence.\n\n{text}",
    "Summarise the following text in three bullet points.\n\n{text}",
    "Read this text and list its key facts.\n\n{text}",
    "Give a short summary of the passage below.\n\n{text}",
    "What is the main point of this passage? Answer in two sentences.\n\n{text}",
    "Write a headline for this report and then summarise it briefly.\n\n{text}",
]


def first_code_block(text: str) -> str | None:
    """The first fenced code block of an answer, without its fences (None when it has none)."""
    parts = text.split("```")
    if len(parts) < 3:
        return None
    block = parts[1].split("\n", 1)
    code = block[1] if len(block) == 2 and block[0].strip().isidentifier() else parts[1]
    return code.strip() or None


def summary_pairs(count: int, passages: int, shapes: int) -> list[tuple[int, int]]:
    """(passage, request shape) for `count` summarising turns: each passage in turn, its shape moving on by
    one every time the passages come round again, so no pair repeats (at most passages x shapes of them).
    The first `passages` pairs are (i, i % shapes)."""
    count = min(count, passages * shapes)
    return [(i % passages, (i % passages + i // passages) % shapes) for i in range(count)]


def templated_requests(seed: int) -> list[str]:
    """TEMPLATES x TOPICS in template order, then TEMPLATES x TOPICS_MORE shuffled (earlier ids keep their texts)."""
    more = [template.format(t=topic) for template in TEMPLATES for topic in TOPICS_MORE]
    random.Random(seed + 5).shuffle(more)
    return [template.format(t=topic) for template in TEMPLATES for topic in TOPICS] + more


def passage_groups(seed: int) -> list[list[str]]:
    """The passage requests in two groups, each shuffled: PASSAGES x TOPICS, then PASSAGES x TOPICS_MORE."""
    groups = []
    for topics, offset in ((TOPICS, 3), (TOPICS_MORE, 6)):
        requests = [shape.format(t=topic) for topic in topics for shape in PASSAGES]
        random.Random(seed + offset).shuffle(requests)
        groups.append(requests)
    return groups


def code_requests(seed: int) -> list[str]:
    """Every code request in the order the generate stage takes them: CODE_SHAPES x CODE_TASKS and SQL_TASKS
    shuffled, then CODE_SHAPES x CODE_TASKS_MORE shuffled (so that adding tasks keeps earlier ids' texts)."""
    first = [shape.format(t=task) for task in CODE_TASKS for shape in CODE_SHAPES]
    first += [f"Write a SQL query that {task}." for task in SQL_TASKS]
    random.Random(seed + 2).shuffle(first)
    more = [shape.format(t=task) for task in CODE_TASKS_MORE for shape in CODE_SHAPES]
    random.Random(seed + 4).shuffle(more)
    return first + more
