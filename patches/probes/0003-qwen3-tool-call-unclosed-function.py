"""Landing probe for 0003: does the Qwen3 tool parser close an unclosed <function=, where the server runs it?

It enters where the server enters. `vllm serve --tool-call-parser qwen3_coder --enable-auto-tool-choice`
(no reasoning parser) streams a chat completion through a DelegatingParser whose tool parser is the
Qwen3 engine's adapter (vllm/tool_parsers/qwen3_engine_tool_parser.py -> make_adapters(Qwen3Parser) in
vllm/parser/engine/registered_adapters.py), calling its parse_delta once per engine step with that
step's token ids and detokenized text. The probe builds that parser the same way, with a tokenizer built
the way Qwen's is (byte-level BPE, <tool_call> and </tool_call> added tokens, so they arrive as single
token ids and go through the engine's token-id path, not its text lexer), encodes each model output,
and feeds it one token per delta, the end-of-turn token last, as a real request does. A client must then
see every tool call with its exact name, its streamed argument deltas concatenating to the expected JSON,
and the content after the calls.

The probe builds the adapter with make_adapters(Qwen3Parser), as registered_adapters does, instead of
importing Qwen3EngineToolParser: that module imports every engine parser, mistral's among them, which
needs ijson and mistral_common (not in the probe venv; mistral_common pins numpy < 2.4). It reads the
tree's source to check that qwen3_coder still names that class.

Run with the tree on PYTHONPATH (vpatch runs it with cwd = the tree root).
Exit 0: every case is handled (fix present). Exit 1: a case loses or garbles a call or the content (bug
present). Exit 2: the probe could not decide, because
- the tree's qwen3_coder tool parser is no longer the Qwen3 engine adapter built this way, or the parser
  or its parse_delta does not accept the arguments the server passes (the probe must be updated), or
- the scenario did not reach the bug's path: the tokenizer does not give the tree's tool-call tags as
  single token ids, or the well-formed CONTROL did not stream as its tool call and content.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import sys
from pathlib import Path

# vpatch's probe exit codes (vpatch.probes): 0 fixed, 1 bug, 2 cannot decide.
ERROR = 2
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen's tokenizer has these as added (not special) tokens, as the test server's model has.
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
VOCAB_SIZE = 640
# Token ids per streamed delta: one per engine step, and several, as the server sends them when the client
# reads slower than the engine decodes (seen on the test server: chunks of 2 and 3 ids).
DELTA_TOKENS = (1, 3)
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                      "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "write_file", "description": "Write a file",
                                      "parameters": {"type": "object", "properties": {"content": {"type": "string"}}}}},
]
PROMPT = "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"
# A well-formed call: if the server's parser does not stream this one, it never reached its tool-call
# transitions on the token-id path and the malformed cases below say nothing.
CONTROL = (
    "well-formed tool call",
    (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>\nIt is sunny."
    ),
    [("get_weather", {"city": "Paris"})],
    "It is sunny.",
)
# Well-formed calls that a fix must not break (case, model output, calls, content). A coding agent writes
# files that mention the tags: a literal <tool_call> inside a parameter value is that value's text, as
# upstream's own tests require (test_qwen3.py, test_tool_call_tag_is_ok_inside_parameter and its streaming
# twin, v0.33.0). A fix that ends the open call at that <tool_call> loses the call's arguments.
WELL_FORMED = [
    (
        "a literal <tool_call> inside a parameter value",
        (
            "<tool_call>\n<function=write_file>\n<parameter=content>\nDocument <tool_call> usage\n"
            "</parameter>\n</function>\n</tool_call>\nWritten."
        ),
        [("write_file", {"content": "Document <tool_call> usage"})],
        "Written.",
    ),
]
# (case, model output, calls a client must see, content that must follow them)
CASES = [
    (
        "function name left open before </tool_call>",
        "<tool_call>\n<function=get_weather\n</tool_call>\nIt is sunny.",
        [("get_weather", {})],
        "It is sunny.",
    ),
    (
        "function name left open before the next <tool_call>",
        (
            "<tool_call>\n<function=get_weather\n<tool_call>\n<function=get_time>\n"
            "<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>\nDone."
        ),
        [("get_weather", {}), ("get_time", {"zone": "UTC"})],
        "Done.",
    ),
    (
        "function name left open before the next <function=",
        (
            "<tool_call>\n<function=get_weather\n<function=get_time>\n"
            "<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>\nDone."
        ),
        [("get_weather", {}), ("get_time", {"zone": "UTC"})],
        "Done.",
    ),
    (
        "function body left open before the next <function=",
        (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n"
            "</tool_call>\nDone."
        ),
        [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "UTC"})],
        "Done.",
    ),
    (
        "function body left open before the next <tool_call>",
        (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n"
            "</function>\n</tool_call>\nDone."
        ),
        [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "UTC"})],
        "Done.",
    ),
]
# What the server's parse_delta call passes (chat_completion/serving.py), and what the parser is built with.
NEEDS = {
    "__init__": ("tokenizer", "tools", "chat_template_kwargs", "model_config"),
    "parse_delta": ("delta_text", "delta_token_ids", "request", "prompt_token_ids", "finished"),
    # A chat completion without streaming (chat_completion/serving.py, v0.28.0 to v0.33.0).
    "parse": ("model_output", "request", "enable_auto_tools", "model_output_token_ids"),
}


class CannotDecide(Exception):
    """The tree does not let the probe build or reach its scenario."""


def _tree_source(relative: str) -> ast.Module:
    path = Path(os.getcwd()) / relative
    if not path.is_file():
        raise CannotDecide(f"the tree has no {relative}: update the probe")
    return ast.parse(path.read_text(encoding="utf-8"))


def _check_server_parser() -> None:
    """qwen3_coder must still be Qwen3EngineToolParser, a subclass of make_adapters(Qwen3Parser)'s tool adapter."""
    registry = _tree_source("vllm/tool_parsers/__init__.py")
    entries = [
        ast.literal_eval(node.values[node.keys.index(key)])
        for node in ast.walk(registry) if isinstance(node, ast.Dict)
        for key in node.keys if isinstance(key, ast.Constant) and key.value == "qwen3_coder"
    ]
    if entries != [("qwen3_engine_tool_parser", "Qwen3EngineToolParser")]:
        raise CannotDecide(f"qwen3_coder is registered as {entries!r}, not qwen3_engine_tool_parser."
                           "Qwen3EngineToolParser: update the probe")
    module = _tree_source("vllm/tool_parsers/qwen3_engine_tool_parser.py")
    bases = [ast.unparse(b) for node in module.body if isinstance(node, ast.ClassDef)
             and node.name == "Qwen3EngineToolParser" for b in node.bases]
    imported = any(isinstance(n, ast.ImportFrom) and n.module == "vllm.parser.engine.registered_adapters"
                   and any(a.name == "Qwen3ParserToolAdapter" for a in n.names) for n in module.body)
    if bases != ["Qwen3ParserToolAdapter"] or not imported:
        raise CannotDecide(f"Qwen3EngineToolParser derives from {bases!r}, not registered_adapters."
                           "Qwen3ParserToolAdapter: update the probe")
    adapters = _tree_source("vllm/parser/engine/registered_adapters.py")
    made = [n.targets[0] for n in adapters.body if isinstance(n, ast.Assign)
            and ast.unparse(n.value) == "make_adapters(Qwen3Parser)"]
    # (reasoning adapter, tool adapter) = make_adapters(Qwen3Parser)
    if not any(isinstance(t, ast.Tuple) and len(t.elts) == 2 and ast.unparse(t.elts[1]) == "Qwen3ParserToolAdapter"
               for t in made):
        raise CannotDecide("registered_adapters no longer makes Qwen3ParserToolAdapter with "
                           "make_adapters(Qwen3Parser): update the probe")


def _check_api(parser_cls: type) -> None:
    for method, names in NEEDS.items():
        params = inspect.signature(getattr(parser_cls, method)).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        rejected = [n for n in names if n not in params and not takes_any]
        if rejected:
            raise CannotDecide(f"the server's parser (DelegatingParser).{method} does not accept "
                               f"{', '.join(rejected)}: update the probe")


def _tokenizer():
    """Byte-level BPE with Qwen's special and added tokens, trained here on the probe's own texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([PROMPT, CONTROL[1]] + [case[1] for case in WELL_FORMED + CASES], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", model_max_length=32768)
    fast.add_tokens(ADDED, special_tokens=False)
    return fast


class Server:
    """The parser a streamed chat completion runs with qwen3_coder and auto tool choice, as the server builds it."""

    def __init__(self) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.parser.abstract_parser import DelegatingParser
        from vllm.parser.engine.adapters import make_adapters
        from vllm.parser.qwen3 import Qwen3Parser

        _check_server_parser()
        _, tool_adapter = make_adapters(Qwen3Parser)

        # As ParserManager._compose_parser does for a tool parser without a reasoning parser.
        class Parser(DelegatingParser):
            reasoning_parser_cls = None
            tool_parser_cls = tool_adapter

        _check_api(Parser)
        self.parser_cls = Parser
        self.request_cls = ChatCompletionRequest
        self.tokenizer = _tokenizer()
        vocab = self.tokenizer.get_vocab()
        for tag in (Qwen3Parser.TOOL_START, Qwen3Parser.TOOL_END):
            if self.tokenizer.encode(tag, add_special_tokens=False) != [vocab.get(tag)]:
                raise CannotDecide(f"the tokenizer does not give the tree's tag {tag!r} as one token id, so the "
                                   "token-id path the server takes is not reached: update the probe")
        self.tags = {tag: vocab[tag] for tag in (Qwen3Parser.TOOL_START, Qwen3Parser.TOOL_END)}

    def _parser(self, stream: bool):
        request = self.request_cls(model="probe", messages=[{"role": "user", "content": "weather?"}],
                                   tools=TOOLS, tool_choice="auto", stream=stream)
        parser = self.parser_cls(self.tokenizer, request.tools, chat_template_kwargs={}, model_config=None)
        return parser, parser.adjust_request(request)

    def complete(self, text: str) -> tuple[list[tuple[str, str]], str]:
        """The tool calls (name, arguments) and content of a chat completion without streaming."""
        tok = self.tokenizer
        parser, request = self._parser(stream=False)
        ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
        # As serving.py: the output's text (the stop token's left out) and all its token ids.
        _, content, calls = parser.parse(text, request, enable_auto_tools=True, model_output_token_ids=ids)
        return [(call.name, call.arguments) for call in calls or []], content or ""

    def stream(self, text: str, per_delta: int) -> tuple[list[tuple[str, str]], str]:
        """The tool calls (name, streamed arguments) and content a client receives for this model output."""
        tok = self.tokenizer
        parser, request = self._parser(stream=True)
        prompt_ids = tok.encode(PROMPT, add_special_tokens=False)
        # The output as the model generates it, ending with the end-of-turn token (which has no text), in
        # deltas of `per_delta` token ids with the detokenizer's text for them.
        body = tok.encode(text, add_special_tokens=False)
        ids = [*body, tok.eos_token_id]
        steps, previous = [], ""
        for n in range(0, len(ids), per_delta):
            # adjust_request turned skip_special_tokens off; the stop token's own text is left out, as vLLM does.
            current = tok.decode(body[: n + per_delta], skip_special_tokens=request.skip_special_tokens)
            steps.append((current[len(previous):], ids[n : n + per_delta]))
            previous = current
        names: dict[int, str] = {}
        args: dict[int, str] = {}
        content: list[str] = []
        for n, (delta_text, delta_ids) in enumerate(steps):
            delta = parser.parse_delta(delta_text=delta_text, delta_token_ids=delta_ids, request=request,
                                       prompt_token_ids=prompt_ids, finished=n == len(steps) - 1)
            if delta is None:
                continue
            if delta.content:
                content.append(delta.content)
            for call in delta.tool_calls or []:
                function = call.function
                if function is not None and function.name:
                    names[call.index] = names.get(call.index, "") + function.name
                if function is not None and function.arguments:
                    args[call.index] = args.get(call.index, "") + function.arguments
                args.setdefault(call.index, "")
        calls = [(names.get(i, ""), args[i]) for i in sorted(args)]
        return calls, "".join(content)


def _problems(server: Server, text: str, expected_calls: list, expected_content: str) -> tuple[list[str], str]:
    """What is wrong in what a client receives, streamed in each delta size, and what it received in the first."""
    problems: list[str] = []
    shown = ""
    for per_delta in (*DELTA_TOKENS, 0):
        calls, content = server.stream(text, per_delta) if per_delta else server.complete(text)
        where = f"{per_delta} token(s) per delta" if per_delta else "not streamed"
        seen = []
        for index, (name, streamed) in enumerate(calls):
            try:
                seen.append((name, json.loads(streamed or "{}")))
            except ValueError:
                problems.append(f"{where}: tool call {index} ({name!r}) streamed invalid JSON {streamed!r}")
        if len(seen) == len(calls) and seen != expected_calls:
            problems.append(f"{where}: tool calls {seen!r}, expected {expected_calls!r}")
        # Whitespace around the content depends on how tokens group into deltas, not on the parser's states.
        # Without streaming, vLLM's qwen3_coder result drops the content after the calls even for the
        # well-formed control (v0.28.0 to v0.33.0, as on the CPU server): there only the calls are compared.
        if per_delta and content.strip() != expected_content:
            problems.append(f"{where}: content {content!r}, expected {expected_content!r}")
        shown = shown or f"calls {seen or calls!r}, content {content!r}"
    return problems, shown


def main() -> int:
    sys.path.insert(0, os.getcwd())
    try:
        server = Server()
        control, seen = _problems(server, *CONTROL[1:])
    except CannotDecide as exc:
        print(f"cannot decide: {exc}")
        return ERROR
    except Exception as exc:  # noqa: BLE001 - any failure here means "cannot decide"
        print(f"probe error building the server's parser or on the control: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return ERROR
    if control:
        print("cannot decide: the well-formed control stream was mishandled, so the server's parser never "
              "reached its tool-call code: " + "; ".join(control))
        return ERROR
    print(f"tokenizer: byte-level BPE, {len(server.tokenizer)} tokens; tag ids {server.tags}")
    print(f"ok   {CONTROL[0]} (control): {seen}")
    broken = 0
    failed = 0
    for malformed, (name, text, expected_calls, expected_content) in [(False, c) for c in WELL_FORMED] + [
            (True, c) for c in CASES]:
        try:
            problems, seen = _problems(server, text, expected_calls, expected_content)
        except Exception as exc:  # noqa: BLE001 - any failure here means "cannot decide"
            print(f"probe error on {name!r}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return ERROR
        print(f"{'ok  ' if not problems else 'FAIL'} {name}{'' if malformed else ' (well-formed)'}: {seen}")
        for problem in problems:
            print(f"     {problem}")
        failed += bool(problems) and malformed
        broken += bool(problems) and not malformed
    # Both say "the bug is there": a tree that breaks a well-formed call has no fix, whatever it does with the rest.
    if broken or failed:
        print(f"FAIL: {failed} of {len(CASES)} malformed tool calls mishandled, {broken} of {len(WELL_FORMED)} "
              "well-formed ones broken, on the server's path (streamed and not)")
        return 1
    print(f"PASS: all {len(CASES)} malformed tool calls handled and {len(WELL_FORMED)} well-formed kept, on the "
          "server's path (streamed and not)")
    return 0

if __name__ == "__main__":
    sys.exit(main())
