"""ALFWorld (household tasks as text games) on the real `alfworld` engine.

Games are read from ALFWorld's standard data layout, so a full `alfworld-download` works
unchanged: DATA/json_2.1.1/{train,valid_seen,valid_unseen}/<task>/<trial>/{game.tw-pddl,
traj_data.json, initial_state.pddl}, DATA/logic/{alfred.pddl,alfred.twl2}. DATA is the
`data_dir` kwarg, else $ALFWORLD_DATA, else ALFWorld's own default ~/.cache/alfworld.
The engine is TextWorld's PddlEnv with ALFWorld's demangler, as in ALFWorld's
AlfredTWEnv; the expert is ALFWorld's handcoded TextWorld expert (or the PDDL planner).

`python -m envs.alfworld_env generate --data-dir SRC --out DST` makes more games offline
from the scenes a data dir already has (see `generate`).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

from envs.textworld_env import ENGINE_LOCK, CommandGameEnv

SPLITS = ("train", "valid_seen", "valid_unseen")
TASK_TYPES = {
    1: "pick_and_place_simple",
    2: "look_at_obj_in_light",
    3: "pick_clean_then_place_in_recep",
    4: "pick_heat_then_place_in_recep",
    5: "pick_cool_then_place_in_recep",
    6: "pick_two_obj_and_place",
}
INSTRUCTIONS = (
    "You are a household robot in a room. Your task is to: {goal}\n"
    "Commands the room understands: go to (receptacle), open (receptacle), close (receptacle), "
    "take (object) from (receptacle), move (object) to (receptacle), examine (something), "
    "use (object), heat (object) with (receptacle), clean (object) with (receptacle), "
    "cool (object) with (receptacle), inventory, look.\n"
    "Each turn, answer with exactly one of the available actions listed under the observation, "
    "written as shown (for example: {example}). Anything else is not understood."
)
_GOAL = re.compile(r"Your task is to:\s*(.+)")


def default_data_dir() -> Path:
    return Path(os.environ.get("ALFWORLD_DATA") or Path.home() / ".cache" / "alfworld")


def _import_alfworld() -> None:
    # `import alfworld` makes the dir $ALFWORLD_DATA names and crashes on an empty value.
    if os.environ.get("ALFWORLD_DATA") == "":
        del os.environ["ALFWORLD_DATA"]
    import alfworld  # noqa: F401


def find_games(data_dir: str | Path, split: str, task_types: list[str]) -> list[Path]:
    """Solvable game files of `split`, sorted (the order seeds index), as ALFWorld's AlfredTWEnv selects them."""
    root = Path(data_dir) / "json_2.1.1" / split
    games = []
    for game in sorted(root.glob("*/*/game.tw-pddl")):
        trial = game.parent
        # AlfredTWEnv's rules: the TextWorld engine supports neither movable receptacles nor slicing.
        if "movable" in str(trial) or "Sliced" in str(trial) or not (trial / "traj_data.json").is_file():
            continue
        if trial.parent.name.split("-")[0] not in task_types:
            continue
        try:
            if json.loads(game.read_text()).get("solvable"):
                games.append(game)
        except (OSError, ValueError):
            continue  # a broken file is not a game
    return games


# -- the engine's translation, done once per game ---------------------------------------------


class _MemoDownward:
    """Stands in for `fast_downward` inside textworld's PDDL logic.

    Translating a game's PDDL to SAS is ~85% of a reset and depends only on the PDDL text,
    so its result (read-only afterwards) is kept for the last few games. It runs under a
    lock because the translator keeps module-global options and swaps sys.argv and
    sys.stdout, which would race between envs stepped in threads.
    """

    def __init__(self, module: Any, size: int = 16):
        self._module = module
        self._size = size
        self._memo: OrderedDict[tuple, Any] = OrderedDict()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def pddl2sas(self, domain: str, problem: str, verbose: bool = False, optimize: bool = False):
        key = (domain, problem, verbose, optimize)
        with ENGINE_LOCK:
            if key in self._memo:
                self._memo.move_to_end(key)
                return self._memo[key]
            argv = list(sys.argv)  # pddl2sas overwrites sys.argv for its option parser
            try:
                result = self._module.pddl2sas(domain, problem, verbose=verbose, optimize=optimize)
            finally:
                sys.argv = argv
            self._memo[key] = result
            while len(self._memo) > self._size:
                self._memo.popitem(last=False)
            return result


def _install_memo() -> None:
    from textworld.envs.pddl import logic

    with ENGINE_LOCK:
        if not isinstance(logic.fast_downward, _MemoDownward):
            logic.fast_downward = _MemoDownward(logic.fast_downward)


# -- the env ---------------------------------------------------------------------------------


class ALFWorldEnv(CommandGameEnv):
    """An ALFWorld game per seed (game `seed % n` of the split's sorted games); reward 1 on a win.

    `task_types` limits the games to some of TASK_TYPES (ids or names); `num_games` to the
    first n. `expert` is "handcoded" (ALFWorld's rule-based expert, which explores like an
    agent) or "planner" (fast-downward's plan on the full state, i.e. the walkthrough).
    """

    def __init__(
        self,
        data_dir: str | None = None,
        split: str = "valid_unseen",
        task_types: list[int | str] | None = None,
        num_games: int | None = None,
        expert: str = "handcoded",
        max_steps: int | None = None,
        invalid_action_penalty: float = 0.0,
        show_admissible: bool = True,
        render_mode: str | None = None,
    ):
        super().__init__(max_steps, invalid_action_penalty, show_admissible, render_mode)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if expert not in ("handcoded", "planner"):
            raise ValueError(f"expert must be 'handcoded' or 'planner', got {expert!r}")
        types = [TASK_TYPES.get(t, t) for t in (task_types or TASK_TYPES)]
        unknown = set(types) - set(TASK_TYPES.values())
        if unknown:
            raise ValueError(f"unknown task types {sorted(unknown)}; known: {TASK_TYPES}")
        self.data_dir = Path(data_dir) if data_dir else default_data_dir()
        self.split = split
        self.games = find_games(self.data_dir, split, types)[:num_games]
        if not self.games:
            raise FileNotFoundError(
                f"no solvable ALFWorld games of types {types} under {self.data_dir / 'json_2.1.1' / split}; "
                "pass data_dir= or set ALFWORLD_DATA to an ALFWorld data dir (alfworld-download)"
            )
        self.expert = expert
        self.game: Path | None = None
        self._env: Any = None  # AlfredInfos(AlfredDemangler(PddlEnv))
        self._pddl: Any = None
        self._state: Any = None
        self._handcoded: Any = None
        self._next_expert: str | None = None

    def warm_up(self) -> None:
        """Import alfworld and textworld's PDDL engine (~1.4 s), as the first game load would."""
        _import_alfworld()
        import alfworld.agents.environment.alfred_tw_env  # noqa: F401
        import textworld.envs  # noqa: F401

    def _make_engine(self) -> None:
        self.warm_up()
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        from textworld.envs import PddlEnv

        _install_memo()
        # The handcoded expert reads the state's facts (as in ALFWorld's AlfredExpert); they cost time.
        infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=self.expert == "handcoded",
                                   extras=["gamefile"])
        self._pddl = PddlEnv(infos)
        self._env = AlfredInfos(AlfredDemangler(self._pddl, shuffle=False))

    def _load(self, seed: int | None) -> tuple[str, list[str], str]:
        # the PDDL engine (libdownward through ctypes) keeps process-global state: envs
        # stepped in parallel threads crash the process, so every engine call is serialised
        with ENGINE_LOCK:
            return self._load_locked(seed)

    def _load_locked(self, seed: int | None) -> tuple[str, list[str], str]:
        index = seed if seed is not None else int(self.np_random.integers(2**31))
        game = self.games[index % len(self.games)]
        if self._env is None:
            self._make_engine()
        if game != self.game:
            self.game = None  # until loaded: a failed load must not look like the old game
            self._env.load(str(game))
            self.game = game
        self._state = self._env.reset()
        self._next_expert = None
        if self.expert == "handcoded":
            from alfworld.agents.expert import HandCodedTWAgent

            # max_steps as ALFWorld's AlfredExpert; past it the expert gives up (see _advise).
            self._handcoded = HandCodedTWAgent(max_steps=200)
            self._handcoded.reset(str(game))
            self._advise(None)
        feedback = self._state.feedback
        found = _GOAL.search(feedback)
        goal = found.group(1).strip() if found else "see the observation"
        admissible = list(self._state["admissible_commands"])
        instructions = INSTRUCTIONS.format(goal=goal, example=admissible[0] if admissible else "look")
        return feedback, admissible, instructions

    def _send(self, command: str) -> tuple[str, list[str], bool, bool, float]:
        with ENGINE_LOCK:
            return self._send_locked(command)

    def _send_locked(self, command: str) -> tuple[str, list[str], bool, bool, float]:
        self._state, _, _ = self._env.step(command)
        if self._handcoded is not None:
            self._advise(command)
        s = self._state
        won = bool(s["won"])
        return s.feedback, list(s["admissible_commands"]), won, False, float(won)

    def _advise(self, last_command: str | None) -> None:
        """Feed the handcoded expert the new state, as ALFWorld's AlfredExpert does every step."""
        try:
            if last_command is None:
                self._handcoded.observe(self._state["feedback"])
                self._next_expert = "look"
            else:
                action = self._handcoded.act(self._state, 0, self._state["won"], last_command)
                self._next_expert = action if action in self._state["admissible_commands"] else "look"
        except Exception:  # the expert gives up (timeout, unknown situation): no advice, never a crash
            self._next_expert = None

    def _expert(self) -> str | None:
        if self.expert == "planner":
            with ENGINE_LOCK:
                plan = self._pddl._pddl_state.replan(self._pddl._entity_infos)
            return plan[0] if plan else None
        return self._next_expert

    def close(self) -> None:
        self._closed = True
        env, self._env = self._env, None
        if env is None:
            return
        with ENGINE_LOCK:
            env.close()
            # PddlEnv loads a private copy of libdownward.so. Unloading it here
            # (fast_downward.close_lib) crashes the interpreter at exit, so the copy stays
            # loaded until the process ends: one small leak per env instance.
            self._pddl = None


# -- offline game generation ------------------------------------------------------------------
#
# ALFWorld's scenes (initial_state.pddl) come from ALFRED's AI2-THOR generator, which the
# alfworld wheel cannot run offline: ai2thor fetches a Unity build at run time, and the FF
# planner binary, its PutTaskExtended domain and the trajectory scripts are not in the
# wheel. What it ships is the rest of `alfworld-generate`: every task type's PDDL goal
# (alfworld.gen.goal_library), the goal text (add_task_to_grammar), the TextWorld PDDL
# domain and grammar, and the expert that keeps only solvable games. `generate` runs those
# on each scene a data dir has: the scene's own task again (what alfworld-generate does),
# plus new tasks built from the objects and receptacles the scene's PDDL lists.

PLACE_TASKS = {  # task type -> (object property it needs, appliance it needs)
    "pick_and_place_simple": (None, None),
    "pick_clean_then_place_in_recep": ("cleanable", "SinkBasin"),
    "pick_heat_then_place_in_recep": ("heatable", "Microwave"),
    "pick_cool_then_place_in_recep": ("coolable", "Fridge"),
    "pick_two_obj_and_place": (None, None),
}
LIGHTS = ("DeskLamp", "FloorLamp")
_FACT = re.compile(r"\((\w+)((?: [^()\s]+)+)\)")


def _params(task_type: str, obj: str, recep: str = "", toggle: str = "") -> dict[str, Any]:
    params = {"object_target": obj, "parent_target": recep, "toggle_target": toggle,
              "mrecep_target": "", "object_sliced": False}
    return {"task_type": task_type, "pddl_params": params}


def scene_tasks(problem: str) -> list[dict[str, Any]]:
    """Every task of TASK_TYPES (bar movable receptacles and slicing) a scene's objects allow."""
    init = problem.split("(:init", 1)[1].split("(:goal", 1)[0]
    types: dict[str, str] = {}
    receps: set[str] = set()
    contain: set[tuple[str, str]] = set()
    props: dict[str, set[str]] = {}
    for name, args in _FACT.findall(init):
        args = [a.removesuffix("Type") for a in args.split()]
        if name == "objectType" and len(args) == 2:
            types[args[0]] = args[1]
        elif name == "receptacleType" and len(args) == 2:
            receps.add(args[1])
        elif name == "canContain" and len(args) == 2:
            contain.add((args[0], args[1]))
        elif len(args) == 1:
            props.setdefault(name, set()).add(args[0])
    pickable = props.get("pickupable", set())

    def instances(obj_type: str, prop: str | None) -> int:
        return sum(1 for o in pickable if types.get(o) == obj_type and (prop is None or o in props.get(prop, ())))

    tasks = []
    for task_type, (prop, appliance) in PLACE_TASKS.items():
        for obj in sorted({types[o] for o in pickable if o in types}):
            enough = instances(obj, prop) >= (2 if task_type == "pick_two_obj_and_place" else 1)
            if enough and (appliance is None or appliance in receps):
                tasks += [_params(task_type, obj, recep) for recep in sorted(receps) if (recep, obj) in contain]
    lights = {types[o] for o in props.get("toggleable", ()) if types.get(o) in LIGHTS}
    for toggle in sorted(lights):
        tasks += [_params("look_at_obj_in_light", obj, toggle=toggle) for obj in sorted({types[o] for o in pickable})]
    return tasks


def expert_walkthrough(game_file: Path, max_steps: int = 150) -> list[str] | None:
    """The handcoded expert's winning commands, or None (unsolved, or already won at the start)."""
    _import_alfworld()
    import fast_downward
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos
    from textworld.envs import PddlEnv

    _install_memo()
    pddl = PddlEnv(textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"]))
    env = AlfredExpert(AlfredInfos(AlfredDemangler(pddl, shuffle=False)), expert_type="handcoded")
    try:
        env.load(str(game_file))
        state = env.reset()
        walkthrough = []
        for _ in range(max_steps if not state["won"] else 0):
            walkthrough.append(state["extra.expert_plan"][0])
            state, _, _ = env.step(walkthrough[-1])
            if state["won"]:
                return walkthrough
        return None
    except Exception:  # the expert gave up: ALFWorld's generator counts that as unsolvable too
        return None
    finally:
        env.close()
        fast_downward.close_lib(pddl.downward_lib)


def generate(data_dir: str | Path, out: str | Path, split: str = "valid_unseen", new_tasks: int = 5,
             seed: int = 0, log: Any = print) -> list[Path]:
    """Write each scene's own game and up to `new_tasks` new solvable ones under `out` (a data dir)."""
    import importlib.util
    import random
    import shutil

    _import_alfworld()
    import alfworld.gen.goal_library as glib
    from alfworld.agents.utils.misc import add_task_to_grammar

    data_dir, out = Path(data_dir), Path(out)
    logic = data_dir / "logic"
    if not (logic / "alfred.pddl").is_file():  # the wheel ships the same two files
        logic = Path(importlib.util.find_spec("alfworld").origin).parent / "data"
    (out / "logic").mkdir(parents=True, exist_ok=True)
    for name in ("alfred.pddl", "alfred.twl2"):
        shutil.copyfile(logic / name, out / "logic" / name)
    domain, grammar = (logic / "alfred.pddl").read_text(), (logic / "alfred.twl2").read_text()
    rng = random.Random(seed)
    saved = random.getstate()  # ALFWorld picks goal templates with the global `random`
    random.seed(seed)
    made = []
    try:
        for traj_file in sorted((data_dir / "json_2.1.1" / split).glob("*/*/traj_data.json")):
            trial = traj_file.parent
            if "movable" in str(trial) or "Sliced" in str(trial) or not (trial / "initial_state.pddl").is_file():
                continue
            traj = json.loads(traj_file.read_text())
            problem = (trial / "initial_state.pddl").read_text()
            own = {"task_type": traj["task_type"], "pddl_params": traj["pddl_params"]}
            others = [t for t in scene_tasks(problem) if t["task_type"] in TASK_TYPES.values()
                      and t["pddl_params"] != {**own["pddl_params"], "object_sliced": False}]
            rng.shuffle(others)
            kept = 0
            for i, task in enumerate([own, *others]):
                if kept > new_tasks:
                    break
                if i == 0:  # the scene's own task, where the source trial was
                    dest, task_traj, task_problem = out / trial.relative_to(data_dir), traj, problem
                else:
                    p = task["pddl_params"]
                    name = "-".join([task["task_type"], p["object_target"], p["mrecep_target"] or "None",
                                     p["parent_target"] or p["toggle_target"], str(traj["scene"]["scene_num"])])
                    dest = out / "json_2.1.1" / split / name / f"trial_gen{seed}_{trial.name}"
                    # The source's plan, images and annotations describe its own task: not copied.
                    task_traj = {**task, "scene": traj["scene"], "task_id": f"gen{seed}_{i}",
                                 "turk_annotations": {"anns": []}}
                    goal = glib.gdict[task["task_type"]]["pddl"].format(
                        obj=p["object_target"], recep=p["parent_target"], toggle=p["toggle_target"], mrecep="")
                    task_problem = problem[: problem.index("(:goal")] + goal.replace("#", "-")
                dest.mkdir(parents=True, exist_ok=True)
                (dest / "traj_data.json").write_text(json.dumps(task_traj))
                (dest / "initial_state.pddl").write_text(task_problem)
                game = {"pddl_domain": domain, "grammar": add_task_to_grammar(grammar, task_traj, rng=rng),
                        "pddl_problem": task_problem, "solvable": None, "walkthrough": None}
                (dest / "game.tw-pddl").write_text(json.dumps(game))
                walkthrough = expert_walkthrough(dest / "game.tw-pddl")
                if walkthrough is None:
                    log(f"unsolvable, dropped: {dest}")
                    shutil.rmtree(dest)
                    continue
                game.update(solvable=True, walkthrough=walkthrough)
                (dest / "game.tw-pddl").write_text(json.dumps(game))
                log(f"{len(walkthrough):3d} expert steps: {dest}")
                made.append(dest / "game.tw-pddl")
                kept += 1
    finally:
        random.setstate(saved)
    return made


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("generate", help="make solvable games from the scenes of a data dir")
    gen.add_argument("--data-dir", default=None, help="source data dir (default: $ALFWORLD_DATA or ~/.cache/alfworld)")
    gen.add_argument("--out", required=True, help="output data dir (same layout; use it as data_dir / ALFWORLD_DATA)")
    gen.add_argument("--split", default="valid_unseen", choices=SPLITS)
    gen.add_argument("--new-tasks", type=int, default=5, help="new tasks per scene, besides its own")
    gen.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    made = generate(args.data_dir or default_data_dir(), args.out, args.split, args.new_tasks, args.seed)
    print(f"{len(made)} games written under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
