"""Diverse chat requests for a self-distillation corpus, made offline.

Four sources, all deterministic given a seed:
- templated requests: topics (science, history, everyday life, work, arts, technology, ...) x task templates
  (explain, compare, list, story, poem, email, plan, quiz, ...) x an optional style modifier;
- code requests built from real standard-library functions: their qualified names and the first line of their
  docstrings, read with `inspect` from this interpreter (nothing downloaded);
- self-instruct seeds: instructions that ask the target itself to write a user request about a topic
  (`SELF_INSTRUCT_TEMPLATES`); the requests it writes join the pool (see `smcsd.train.corpus`);
- follow-up turns for multi-turn conversations (`FOLLOW_UPS`).

`request_pool(n, seed)` returns unique requests in a fixed shuffled order.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import itertools
import warnings

import numpy as np

__all__ = ["CODE_MODULES", "FOLLOW_UPS", "SELF_INSTRUCT_TEMPLATES", "TASKS", "TOPICS", "code_requests", "request_pool",
           "dedup", "self_instruct_requests", "templated_requests"]

TOPICS = {
    "science": [
        "photosynthesis", "black holes", "the water cycle", "plate tectonics", "DNA replication", "the periodic table",
        "quantum entanglement", "the speed of light", "evolution by natural selection", "the immune system",
        "volcanoes", "earthquakes", "ocean currents", "the greenhouse effect", "the Big Bang", "neutron stars",
        "the human heart", "antibiotics", "vaccines", "gravity", "magnetism", "static electricity", "sound waves",
        "rainbows", "the nitrogen cycle", "cell division", "enzymes", "the solar system", "comets", "Mars",
        "Jupiter's moons", "tides", "glaciers", "fossils", "dinosaurs", "bird migration", "coral reefs",
        "rainforests", "deserts", "bacteria", "viruses", "the nervous system", "hormones", "sleep", "memory",
        "the human brain", "nuclear fusion", "radioactivity", "chemical bonds", "acids and bases", "friction",
        "thermodynamics", "entropy", "superconductors", "semiconductors", "lasers", "telescopes", "microscopes",
        "the ozone layer", "hurricanes", "tornadoes", "lightning", "clouds", "soil erosion", "honey bees", "ants",
        "octopuses", "whales", "mushrooms", "trees", "seeds", "pollination", "genetics", "CRISPR", "stem cells",
    ],
    "history": [
        "the Roman Empire", "ancient Egypt", "the French Revolution", "the Industrial Revolution", "the Renaissance",
        "the printing press", "the Silk Road", "the Cold War", "the moon landing", "World War I", "World War II",
        "the fall of the Berlin Wall", "the Vikings", "the Aztecs", "the Ming dynasty", "ancient Greece",
        "the Magna Carta", "the American Revolution", "the invention of the telephone", "the Black Death",
        "the Ottoman Empire", "the age of exploration", "the history of writing", "the first computers",
        "the Olympic Games", "the Great Wall of China", "the pyramids", "the Maya civilization", "the Byzantine Empire",
        "the civil rights movement", "women's suffrage", "the history of medicine", "the invention of the wheel",
        "the history of money", "the steam engine", "the Wright brothers", "the Hanseatic League", "samurai",
    ],
    "everyday": [
        "coffee", "tea", "bread baking", "gardening", "recycling", "time management", "public speaking", "budgeting",
        "saving money", "cooking pasta", "healthy breakfasts", "running", "yoga", "meditation", "learning a language",
        "moving to a new city", "job interviews", "writing a resume", "houseplants", "keeping a journal", "camping",
        "hiking", "road trips", "packing for a trip", "adopting a dog", "caring for a cat", "cleaning a kitchen",
        "making friends as an adult", "studying for exams", "procrastination", "birthday parties", "a rainy day",
        "composting", "fixing a flat bicycle tire", "grocery shopping", "meal planning", "drinking enough water",
        "board games", "reading more books", "waking up early", "learning to swim", "first aid", "home workouts",
    ],
    "work": [
        "remote work", "team meetings", "giving feedback", "negotiating a salary", "starting a small business",
        "marketing", "customer service", "project management", "leadership", "writing clear emails",
        "supply chains", "inflation", "compound interest", "the stock market", "insurance", "taxes",
        "entrepreneurship", "product design", "user research", "hiring", "onboarding new employees",
        "burnout", "work-life balance", "open source software", "startups", "accounting", "economics",
    ],
    "technology": [
        "machine learning", "the internet", "electric cars", "renewable energy", "solar panels", "wind turbines",
        "batteries", "smartphones", "cloud computing", "cybersecurity", "passwords", "encryption", "databases",
        "operating systems", "web browsers", "GPS", "3D printing", "robots", "self-driving cars", "blockchain",
        "virtual reality", "video compression", "search engines", "social media", "email", "Wi-Fi", "compilers",
        "version control with git", "neural networks", "large language models", "recommendation systems",
        "computer graphics", "the cloud", "APIs", "unit testing", "code review", "linux", "spreadsheets",
    ],
    "arts": [
        "jazz music", "classical music", "the guitar", "the piano", "poetry", "haiku", "impressionist painting",
        "photography", "film making", "animation", "theatre", "opera", "street art", "sculpture", "architecture",
        "Shakespeare", "science fiction", "fairy tales", "mythology", "dance", "comic books", "video games",
        "calligraphy", "origami", "pottery", "knitting", "fashion", "museums", "novels", "short stories",
    ],
    "society": [
        "democracy", "voting", "human rights", "climate change", "urban planning", "public transport", "libraries",
        "education", "homeschooling", "volunteering", "charity", "the United Nations", "immigration", "cities",
        "rural life", "friendship", "kindness", "ethics", "philosophy", "happiness", "stoicism", "critical thinking",
        "misinformation", "privacy", "free speech", "sports", "football", "chess", "the Olympics", "holidays",
    ],
    "math": [
        "prime numbers", "fractions", "percentages", "probability", "statistics", "the Pythagorean theorem",
        "algebra", "geometry", "calculus", "derivatives", "integrals", "matrices", "logarithms", "infinity",
        "the number pi", "the Fibonacci sequence", "graph theory", "game theory", "sets", "averages", "exponents",
    ],
}

TASKS = [
    "Explain {t} to a ten-year-old.", "Explain {t} in simple terms.", "What is {t}?", "How does {t} work?",
    "Give me three interesting facts about {t}.", "Give me five surprising facts about {t}.",
    "Write a short paragraph about {t}.", "Write a short essay about {t}.", "What are the pros and cons of {t}?",
    "Write a haiku about {t}.", "Write a short poem about {t}.", "Write a limerick about {t}.",
    "Summarise what {t} is in two sentences.", "Write a short story that involves {t}.",
    "List five questions a student might ask about {t}.", "What are common misconceptions about {t}?",
    "Why does {t} matter?", "What is the history of {t}?", "How would you teach {t} to a beginner?",
    "Write a quiz with three multiple-choice questions about {t}.", "Give me a step-by-step guide to {t}.",
    "What are the most important things to know about {t}?", "Compare {t} with {u}.",
    "What do {t} and {u} have in common?", "Write a dialogue between two friends talking about {t}.",
    "Write a short email to a colleague about {t}.", "Write a tweet about {t}.", "Describe {t} in one sentence.",
    "What are the main challenges related to {t}?", "What would happen if {t} did not exist?",
    "Give me an analogy that explains {t}.", "Write a product description inspired by {t}.",
    "What careers are related to {t}?", "Suggest three books or resources for learning about {t}.",
    "Write a news headline and a short article about {t}.", "What are three tips for someone interested in {t}?",
    "Explain the key terms someone needs to understand {t}.", "Tell me a fun fact about {t} and explain it.",
    "How has {t} changed over the last hundred years?", "What is the future of {t}?",
    "Write a short speech about {t} for a school assembly.", "Make a study plan for learning about {t} in a week.",
    "Write a riddle whose answer is related to {t}.", "What questions should I ask an expert on {t}?",
    "Explain {t} as if you were a pirate.", "Write a children's story about {t}.",
    "What are the ethical questions around {t}?", "Outline a presentation about {t}.",
    "Give a real-world example of {t}.", "Correct any mistakes in this statement: '{t} was invented last year.'",
]

MODIFIERS = ["", "", "", " Keep it short.", " Answer in bullet points.", " Be detailed.", " Use an example.",
             " Answer in a friendly tone.", " Use simple words.", " Answer in three sentences or fewer."]

CODE_TEMPLATES = [
    "Explain what `{name}` does in Python and show a short example.",
    "Write a Python example that uses `{name}`.",
    "What is `{name}` in Python's standard library used for? ({doc})",
    "Write a Python function that does the following without using `{name}`: {doc}",
    "When should I use `{name}` in Python? Give an example.",
    "Write a unit test for `{name}`, which is documented as: {doc}",
    "Implement a simplified version of `{name}` in Python. Its documentation says: {doc}",
]

GENERIC_CODE = [
    "Write a Python function that reverses a string.", "Write a Python function to check if a number is prime.",
    "How do I read a CSV file in Python?", "Write a Python class for a simple bank account.",
    "Explain list comprehensions in Python with an example.", "Write a function that merges two sorted lists.",
    "How do I sort a dictionary by value in Python?", "Write a Python script that counts words in a file.",
    "What is the difference between a list and a tuple in Python?", "Write a recursive factorial function.",
    "Write a binary search function in Python.", "How do I handle exceptions in Python?",
    "Write a function that removes duplicates from a list while keeping order.",
    "Explain what a decorator is in Python with an example.", "Write a Python generator that yields squares.",
    "Write a SQL query that finds the ten most recent orders.", "Write a JavaScript function that debounces calls.",
    "Write a bash one-liner that counts lines in all .txt files.", "Explain Big-O notation with examples.",
    "Write a Python function that flattens a nested list.", "How do I write a simple web server in Python?",
    "Write a stack class in Python with push, pop and peek.", "Explain recursion with a simple example.",
    "Write a function that checks whether a string is a palindrome.", "What is a hash map and how does it work?",
    "Write a Python dataclass for a book with a title, an author and a year.", "How do I use git branches?",
    "Write a Python function that converts Celsius to Fahrenheit.", "Explain the difference between == and is.",
    "Write a function that returns the most common word in a text.", "How do I parse JSON in Python?",
]

SELF_INSTRUCT_TEMPLATES = [
    "Write one question that a curious person might ask an AI assistant about {t}. Write only the question.",
    "Write one specific request that a user could give an AI assistant about {t}. Write only the request.",
    "Invent a task about {t} that a student might ask for help with. Write only the task, in one sentence.",
    "Write a question about {t} that has a clear factual answer. Write only the question.",
]

FOLLOW_UPS = [
    "Can you give me an example?", "Explain that more simply.", "Can you summarise your answer in one sentence?",
    "Why is that?", "Can you make it shorter?", "What else should I know?", "Can you say more about the first point?",
    "Thanks! Can you turn that into a list?", "Is there anything that people often get wrong about this?",
    "How would you explain this to a child?", "Can you write that more formally?", "What is a good next step?",
]

CODE_MODULES = ["os", "os.path", "sys", "re", "json", "math", "random", "itertools", "functools", "collections",
                 "string", "textwrap", "datetime", "time", "statistics", "heapq", "bisect", "shutil", "pathlib",
                 "csv", "hashlib", "base64", "uuid", "copy", "operator", "fractions", "decimal", "glob", "fnmatch",
                 "difflib", "zipfile", "gzip", "tempfile", "subprocess", "argparse", "logging", "unittest",
                 "urllib.parse", "html", "calendar", "secrets", "struct", "array", "enum", "typing", "dataclasses",
                 "contextlib", "threading", "queue", "socket", "sqlite3", "pprint", "shlex", "io", "inspect"]


def _all_topics() -> list[str]:
    return [t for group in TOPICS.values() for t in group]


def templated_requests(seed: int = 0) -> list[str]:
    """Every topic x task (a second topic `u` from the same group for comparisons), with a style modifier
    drawn per request."""
    rng = np.random.default_rng([seed, 0x70E1C])
    out = []
    for group in TOPICS.values():
        for t, task in itertools.product(group, TASKS):
            u = group[int(rng.integers(len(group)))]
            if u == t:
                u = group[(group.index(t) + 1) % len(group)]
            out.append(task.format(t=t, u=u) + MODIFIERS[int(rng.integers(len(MODIFIERS)))])
    return out


def _first_doc_line(obj) -> str | None:
    doc = inspect.getdoc(obj)
    if not doc:
        return None
    line = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
    if not 20 <= len(line) <= 200 or "(" == line[:1]:
        return None
    return line


def code_requests(seed: int = 0) -> list[str]:
    """Requests about real standard-library functions: qualified name + the first line of the docstring."""
    rng = np.random.default_rng([seed, 0xC0DE])
    out = []
    for modname in CODE_MODULES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = importlib.import_module(modname)
        except Exception:  # noqa: BLE001 - a module missing on this interpreter is skipped
            continue
        for name in sorted(dir(mod)):
            if name.startswith("_"):
                continue
            obj = getattr(mod, name, None)
            if not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj)):
                continue
            doc = _first_doc_line(obj)
            if doc is None:
                continue
            template = CODE_TEMPLATES[int(rng.integers(len(CODE_TEMPLATES)))]
            out.append(template.format(name=f"{modname}.{name}", doc=doc))
    return out + list(GENERIC_CODE)


def self_instruct_requests(n: int, seed: int = 0) -> list[str]:
    """`n` instructions asking the target to write a user request about a topic (its answers become requests)."""
    rng = np.random.default_rng([seed, 0x5E1F])
    topics = _all_topics()
    return [SELF_INSTRUCT_TEMPLATES[int(rng.integers(len(SELF_INSTRUCT_TEMPLATES)))].format(
        t=topics[int(rng.integers(len(topics)))]) for _ in range(n)]


def dedup(items) -> list[str]:
    seen, out = set(), []
    for s in items:
        key = " ".join(s.lower().split())
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def request_pool(seed: int = 0, exclude=()) -> list[str]:
    """Templated and code requests, de-duplicated (case and whitespace folded), minus `exclude`, shuffled by
    `seed` into a fixed order."""
    excluded = {" ".join(s.lower().split()) for s in exclude}
    pool = [s for s in dedup(templated_requests(seed) + code_requests(seed))
            if " ".join(s.lower().split()) not in excluded]
    order = np.random.default_rng([seed, 0x9001]).permutation(len(pool))
    return [pool[i] for i in order]


def stable_hash(text: str) -> int:
    """A process-independent 64-bit hash of a request (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(" ".join(text.lower().split()).encode(), digest_size=8).digest(), "little")
