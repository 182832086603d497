"""Episode records: the returns (and Atari's game lengths) of finished episodes, from the raw rewards, saved in a
checkpoint (`state`) and loaded back (`load`)."""

from collections import deque
from typing import Optional

import numpy as np
import torch


class Episodes:
    """Returns of the last `window` finished episodes, summed from the rewards given (the raw, unclipped ones)."""

    def __init__(self, num_envs: int, window: int = 20):
        self.ret = np.zeros(num_envs)
        self.finished = deque(maxlen=window)

    def record(self, reward, done, ids=None):
        """One step of every env (or of the envs `ids`, a pool's share): add the rewards, close the done episodes."""
        if ids is None:
            self.ret += reward
            if done.any():  # rare: most steps cost one numpy add
                self.finished.extend(self.ret[done].tolist())
                self.ret[done] = 0
            return
        self.ret[ids] += reward
        if done.any():
            self.finished.extend(self.ret[ids[done]].tolist())
            self.ret[ids[done]] = 0

    def record_steps(self, rewards, dones):
        """`record` for each step of a rollout: rows of the rewards and of the dones after each step."""
        for reward, done in zip(rewards, dones):
            self.record(reward, done)

    def record_one(self, reward: float, done: bool):
        """`record` for one env stepped alone (the off-policy loops): plain numbers, none of numpy's per-call cost."""
        self.ret[0] += reward
        if done:
            self.finished.append(float(self.ret[0]))
            self.ret[0] = 0

    def mean(self) -> Optional[float]:
        return float(np.mean(self.finished)) if self.finished else None

    def state(self) -> dict:
        return dict(ret=torch.as_tensor(self.ret), finished=torch.tensor(list(self.finished), dtype=torch.float64))

    def load(self, state: dict, restart: bool):
        """The state of `state()`; `restart`: the envs could not be saved and start new episodes, so the returns of the
        episodes in flight are dropped."""
        self.ret = np.zeros_like(self.ret) if restart else state["ret"].numpy().copy()
        self.finished.extend(state["finished"].tolist())


class AtariEpisodes(Episodes):
    """The full game's unclipped score, and its length: info["reward"] summed until info["terminated"] (all lives
    lost) or the time limit. The 5-tuple's `terminated` is per life under episodic_life and its reward is clipped, so
    neither is used."""

    def __init__(self, num_envs: int, window: int = 20):
        super().__init__(num_envs, window)
        self.lengths = deque(maxlen=window)

    def step(self, info: dict, truncated: np.ndarray, offset: int = 0):
        """One step of a pool, as its `recv` returned it; `offset` is the index of its first env (a pool numbers its
        envs from 0)."""
        over = np.logical_or(info["terminated"], truncated)
        self.record(info["reward"], over, info["env_id"] + offset)
        self.lengths.extend(info["elapsed_step"][over].tolist())

    def record_steps(self, steps: list):
        """`step` for each of a rollout's steps: (info, truncated, offset) of each pool's `recv` in turn."""
        for info, truncated, offset in steps:
            self.step(info, truncated, offset)

    def mean_length(self) -> Optional[float]:
        return float(np.mean(self.lengths)) if self.lengths else None

    def state(self) -> dict:
        # the finished games only: a resumed run restarts its games, so the scores in flight are lost
        return dict(
            returns=torch.tensor(list(self.finished), dtype=torch.float64),
            lengths=torch.tensor(list(self.lengths), dtype=torch.float64),
        )

    def load(self, state: dict, restart: bool):
        """The finished games of `state()`; `restart` must be said: envpool cannot save a game, the games restart."""
        if not restart:
            raise ValueError("AtariEpisodes: envpool cannot save a game in flight; resume with restart=True")
        self.finished.extend(state["returns"].tolist())
        self.lengths.extend(state["lengths"].tolist())


class MemberAtariEpisodes:
    """Each member's own AtariEpisodes (its games' scores and lengths); the top-level fields are the means of the
    members still training (`Run.live_mean`)."""

    def __init__(self, members: int, num_envs: int):
        self.members = [AtariEpisodes(num_envs) for _ in range(members)]

    def record_steps(self, steps: list):
        """Each member's steps of a rollout: (member, info, truncated, offset) of each `recv` in turn."""
        for k, info, truncated, offset in steps:
            self.members[k].step(info, truncated, offset)

    def means(self) -> list:
        return [member.mean() for member in self.members]

    def mean_lengths(self) -> list:
        return [member.mean_length() for member in self.members]

    def state(self) -> dict:
        return dict(members=[member.state() for member in self.members])

    def load(self, state: dict, restart: bool):
        for member, saved in zip(self.members, state["members"]):
            member.load(saved, restart)


class MemberEpisodes:
    """`Episodes` of `members` runs side by side (the seeds scripts), `num_envs` envs each, in a row: one window of
    finished returns per member; the top-level return is the mean of the members still training (`Run.live_mean`)."""

    def __init__(self, members: int, num_envs: int, window: int = 20):
        self.ret = np.zeros(members * num_envs)
        self.num_envs = num_envs
        self.members = [deque(maxlen=window) for _ in range(members)]

    def record(self, reward, done):
        """One step of every member's envs: add the rewards, close the done episodes into their member's window."""
        self.ret += reward
        if done.any():  # rare: most steps cost one numpy add
            for i in np.flatnonzero(done):
                self.members[i // self.num_envs].append(float(self.ret[i]))
            self.ret[done] = 0

    def record_steps(self, rewards, dones):
        """`record` for each step of a rollout: rows of the rewards and of the dones after each step."""
        for reward, done in zip(rewards, dones):
            self.record(reward, done)

    def means(self) -> list:
        """Each member's mean return over its window (None for a member with no finished episode yet)."""
        return [float(np.mean(finished)) if finished else None for finished in self.members]

    def state(self) -> dict:
        members = [torch.tensor(list(finished), dtype=torch.float64) for finished in self.members]
        return dict(ret=torch.as_tensor(self.ret), members=members)

    def load(self, state: dict, restart: bool):
        self.ret = np.zeros_like(self.ret) if restart else state["ret"].numpy().copy()
        for finished, saved in zip(self.members, state["members"]):
            finished.extend(saved.tolist())
