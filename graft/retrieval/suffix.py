"""A suffix automaton over prompt + output (as in SAM-Decoding), extended one token at a time.

`longest_earlier_match()` finds the longest suffix of the text that also ends at an earlier position
and returns where the text continued after that earlier occurrence (its first occurrence: a state's
`first_end`). Extension is amortised O(1) per token; a query walks suffix links from the last state.
"""

from __future__ import annotations


class SuffixAutomaton:
    def __init__(self):
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.first_end: list[int] = [-1]
        self.last = 0
        self.text: list[int] = []

    def extend(self, tokens) -> None:
        for token in tokens:
            self._add(token)

    def _new_state(self, length: int, first_end: int, transitions: dict, link: int) -> int:
        self.next.append(transitions)
        self.link.append(link)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.length) - 1

    def _add(self, token: int) -> None:
        pos = len(self.text)
        self.text.append(token)
        cur = self._new_state(self.length[self.last] + 1, pos, {}, -1)
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                clone = self._new_state(self.length[p] + 1, self.first_end[q], dict(self.next[q]), self.link[q])
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = clone
                self.link[cur] = clone
        self.last = cur

    def longest_earlier_match(self) -> tuple[int, int]:
        """(match length, position where the earlier occurrence continued); (0, -1) when there is none."""
        end = len(self.text) - 1
        state = self.last
        while state > 0 and self.first_end[state] >= end:
            state = self.link[state]
        if state <= 0:
            return 0, -1
        return self.length[state], self.first_end[state] + 1

    def continuation(self, max_tokens: int, min_match: int = 1) -> tuple[int, list[int]]:
        """(match length, up to `max_tokens` tokens that followed the match's earlier occurrence)."""
        length, start = self.longest_earlier_match()
        if length < min_match:
            return length, []
        return length, self.text[start : start + max_tokens]

    def continuation_after(self, extra: list[int], max_tokens: int, min_match: int = 1) -> tuple[int, list[int]]:
        """As continuation(), for the text followed by `extra` (tokens not added, e.g. a draft path): the
        longest suffix of text + extra that occurs in the text, and what followed its first occurrence.
        The automaton is walked from the whole text along `extra`, falling back by suffix links where the
        text never continued that way; nothing is added to it."""
        if not extra:
            return self.continuation(max_tokens, min_match)
        state, length = self.last, len(self.text)
        for token in extra:
            while state > 0 and token not in self.next[state]:
                state = self.link[state]
                length = self.length[state]
            if token in self.next[state]:
                state, length = self.next[state][token], length + 1
            else:
                state, length = 0, 0
        if length < min_match or state <= 0:
            return length, []
        start = self.first_end[state] + 1  # every occurrence ends inside the text: the match ends in `extra`
        return length, self.text[start : start + max_tokens]

    def sync(self, tokens: list[int]) -> None:
        """Extend with whatever of `tokens` (the whole committed text) the automaton has not seen yet."""
        if len(tokens) > len(self.text):
            self.extend(tokens[len(self.text) :])
