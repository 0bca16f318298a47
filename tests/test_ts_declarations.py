"""The TypeScript declaration reader (tests/ts_declarations.py) on small declaration files
written the way the SDKs' are: the values it finds, and the errors it raises where a name, a
property or a file is not there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ts_declarations import Declarations, Unresolved

SHARED = """
/** A comment's words are no values: 'nope' | "nor this" // nor 'these' */
export type ReasoningEffort = 'none' | 'low' | "high" | null;
export interface Reasoning {
    effort?: ReasoningEffort | null;
    // an open string: any string, and the ones it names
    mode?: (string & {}) | 'standard' | 'pro';
    readonly context?: 'auto' | 'all_turns';
}
export type Quoted = 'it\\'s' | "a \\"b\\"";
"""
MAIN = """
import { APIResource } from "../core/resource.js";
import * as Shared from "./shared.js";
import { ReasoningEffort as Effort, type Reasoning } from './shared.js';
import { GoogleAuthOptions } from 'google-auth-library';
export declare class Responses extends APIResource {
    create(body: CreateParams, options?: RequestOptions): Promise<Response>;
}
export interface CreateParamsBase {
    reasoning?: Shared.Reasoning | null;
    effort?: Effort;
    tool_choice?: ToolChoiceOptions | ToolChoiceTypes | ToolChoiceFunction;
    input?: string | Array<InputItem>;
    include?: Array<Includable> | null;
    tags?: Includable[];
    pairs?: ('a' | 'b')[];
    text?: { format?: { type: 'text' } | { type: 'json_schema'; name: string } };
    auth?: GoogleAuthOptions;
    onEvent?: (event: { type: 'ignored' }) => void;
    tuple?: ['x', 'y'];
    count?: 1 | 2;
    extra?: Record<string, unknown>;
}
export interface CreateParams extends CreateParamsBase {
    stream?: false | null;
}
export type ToolChoiceOptions = 'none' | 'auto' | 'required';
export interface ToolChoiceTypes {
    type: 'file_search' | 'web_search_preview';
}
export interface ToolChoiceFunction {
    name: string;
    type: 'function';
}
export type InputItem = EasyMessage | InputItem.Message | InputItem.FunctionCallOutput;
export interface EasyMessage {
    role: 'user' | 'assistant';
    content: string;
}
export declare namespace InputItem {
    interface Message {
        role: 'user' | 'system' | 'developer';
        status?: 'in_progress' | 'completed';
    }
    interface FunctionCallOutput {
        type: 'function_call_output';
        status?: 'completed' | 'incomplete' | null;
    }
}
export type Includable = 'file_search_call.results' | 'message.output_text.logprobs';
"""
GENAI = """
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
export declare enum Mode {
    /** Unspecified; "quoted" words in comments are no members. */
    MODE_UNSPECIFIED = "MODE_UNSPECIFIED",
    AUTO = "AUTO",
    VALIDATED = "VALIDATED"
}
declare enum Numbered { ZERO, ONE = 1 }
export declare interface FunctionCallingConfig {
    mode?: Mode;
    allowedFunctionNames?: string[];
}
export declare interface ToolConfig {
    functionCallingConfig?: FunctionCallingConfig;
}
export declare class GenerateContentResponse {
    candidates?: Candidate[];
    get text(): string | undefined;
    private constructor();
    #private;
    static create(): GenerateContentResponse;
}
export declare interface Candidate {
    finishReason?: 'STOP' | 'MAX_TOKENS';
}
declare type Category_2 = "hate_speech" | "jailbreak" | (string & {});
declare type Category$ = Category_2;
export declare namespace Interactions {
    export type Category = Category$;
}
declare namespace interactions {
    export { Category_2 as Category }
}
export { Blob_2 as Blob }
declare interface Blob_2 {
    mimeType?: 'image/png';
}
export declare interface Box<T> {
    value?: T;
    label?: Box<T>['kind'];
    kind?: 'small' | 'large';
}
export declare interface AutoOnly {
    mode?: Mode.AUTO;
}
export declare type Chosen = Omit<FunctionCallingConfig, 'allowedFunctionNames'>;
export declare type Conditional<T> = T extends string ? 'yes' : 'no';
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    files = {
        "sdk/resources/shared.d.ts": SHARED,
        "sdk/resources/main.d.ts": MAIN,
        "sdk/core/resource.d.ts": "export declare abstract class APIResource {\n    protected _client: unknown;\n}\n",
        "sdk/index.d.ts": 'export * from "./resources/main.js";\nexport * as Shared from "./resources/shared.js";\n'
        'export { Includable as Include } from "./resources/main.js";\n',
        "genai/dist/genai.d.ts": GENAI,
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


MAIN_TS, GENAI_TS = "sdk/resources/main.d.ts", "genai/dist/genai.d.ts"


def test_a_union_of_string_literals_by_its_name_null_and_open_strings_left_out(root: Path) -> None:
    read = Declarations(root)
    assert read.values("sdk/resources/shared.d.ts", "ReasoningEffort") == {"none", "low", "high"}
    assert read.values("sdk/resources/shared.d.ts", "Reasoning", "mode") == {"standard", "pro"}
    assert read.values("sdk/resources/shared.d.ts", "Reasoning", "context") == {"auto", "all_turns"}
    assert read.values("sdk/resources/shared.d.ts", "Quoted") == {"it's", 'a "b"'}


def test_properties_through_imports_namespaces_and_renamed_imports(root: Path) -> None:
    read = Declarations(root)
    assert read.values(MAIN_TS, "CreateParamsBase", "reasoning.effort") == {"none", "low", "high"}
    assert read.values(MAIN_TS, "CreateParamsBase", "effort") == {"none", "low", "high"}
    assert read.values(MAIN_TS, "InputItem.FunctionCallOutput", "status") == {"completed", "incomplete"}


def test_a_property_of_a_union_is_every_member_that_has_it(root: Path) -> None:
    read = Declarations(root)
    assert read.values(MAIN_TS, "CreateParamsBase", "tool_choice") == {"none", "auto", "required"}
    assert read.values(MAIN_TS, "CreateParamsBase", "tool_choice.type") == {
        "file_search",
        "web_search_preview",
        "function",
    }
    assert read.values(MAIN_TS, "CreateParamsBase", "input[].role") == {"user", "assistant", "system", "developer"}
    assert read.values(MAIN_TS, "CreateParamsBase", "input[].status") == {"in_progress", "completed", "incomplete"}
    assert read.values(MAIN_TS, "CreateParamsBase", "text.format.type") == {"text", "json_schema"}


def test_arrays_in_each_spelling(root: Path) -> None:
    read = Declarations(root)
    includable = {"file_search_call.results", "message.output_text.logprobs"}
    assert read.values(MAIN_TS, "CreateParamsBase", "include[]") == includable
    assert read.values(MAIN_TS, "CreateParamsBase", "tags[]") == includable
    assert read.values(MAIN_TS, "CreateParamsBase", "pairs[]") == {"a", "b"}
    assert read.values(MAIN_TS, "CreateParamsBase", "include") == set()  # the array, not its items


def test_an_interface_has_its_bases_properties(root: Path) -> None:
    read = Declarations(root)
    assert read.values(MAIN_TS, "CreateParams", "tool_choice") == {"none", "auto", "required"}
    assert read.values(MAIN_TS, "CreateParams", "stream") == set()
    assert read.values(GENAI_TS, "Chosen", "mode") == {"MODE_UNSPECIFIED", "AUTO", "VALIDATED"}  # Omit<...>


def test_enums_give_their_string_values(root: Path) -> None:
    read = Declarations(root)
    assert read.values(GENAI_TS, "Mode") == {"MODE_UNSPECIFIED", "AUTO", "VALIDATED"}
    assert read.values(GENAI_TS, "ToolConfig", "functionCallingConfig.mode") == {
        "MODE_UNSPECIFIED",
        "AUTO",
        "VALIDATED",
    }
    assert read.values(GENAI_TS, "AutoOnly", "mode") == {"AUTO"}  # one member, as a type
    assert read.values(GENAI_TS, "Numbered") == set()  # numbers are no strings


def test_classes_give_properties_not_methods_or_accessors(root: Path) -> None:
    read = Declarations(root)
    assert read.values(GENAI_TS, "GenerateContentResponse", "candidates[].finishReason") == {"STOP", "MAX_TOKENS"}
    for method in ("text", "create", "constructor"):
        with pytest.raises(Unresolved, match=f"GenerateContentResponse.{method}: no such property"):
            read.values(GENAI_TS, "GenerateContentResponse", method)


def test_renames_inside_namespaces_and_exports(root: Path) -> None:
    read = Declarations(root)
    assert read.values(GENAI_TS, "Interactions.Category") == {"hate_speech", "jailbreak"}
    assert read.values(GENAI_TS, "interactions.Category") == {"hate_speech", "jailbreak"}
    assert read.values(GENAI_TS, "Blob", "mimeType") == {"image/png"}
    assert read.values("sdk/index.d.ts", "Include") == {"file_search_call.results", "message.output_text.logprobs"}
    assert read.values("sdk/index.d.ts", "Shared.ReasoningEffort") == {"none", "low", "high"}
    assert read.values("sdk/index.d.ts", "ToolChoiceOptions") == {"none", "auto", "required"}  # export *


def test_generics_indexed_access_and_conditional_types(root: Path) -> None:
    read = Declarations(root)
    assert read.values(GENAI_TS, "Box", "value") == set()  # a type parameter: anything
    assert read.values(GENAI_TS, "Box", "label") == {"small", "large"}
    assert read.values(GENAI_TS, "Conditional") == {"yes", "no"}


def test_types_without_strings_have_no_values(root: Path) -> None:
    read = Declarations(root)
    for field in ("auth", "onEvent", "tuple", "count", "extra"):  # another package's, a function ...
        assert read.values(MAIN_TS, "CreateParamsBase", field) == set(), field


@pytest.mark.parametrize(
    ("file", "name", "path", "error"),
    [
        ("sdk/resources/gone.d.ts", "CreateParams", "", "no declaration file"),
        (MAIN_TS, "CreateParamz", "", "CreateParamz is declared nowhere"),
        (MAIN_TS, "InputItem.Mesage", "role", "InputItem.Mesage is declared nowhere"),
        (MAIN_TS, "CreateParamsBase", "reasoning.efort", "CreateParamsBase.reasoning.efort: no such property"),
        (MAIN_TS, "CreateParamsBase", "tool_choice[]", r"CreateParamsBase.tool_choice\[\]: no such property"),
        (GENAI_TS, "Mode.AUTOMATIC", "", "Mode.AUTOMATIC: no such string member"),
    ],
)
def test_what_is_not_there_is_an_error_not_an_empty_list(
    root: Path, file: str, name: str, path: str, error: str
) -> None:
    with pytest.raises(Unresolved, match=error):
        Declarations(root).values(file, name, path)


def test_a_name_used_but_declared_nowhere_is_an_error_when_walked(tmp_path: Path) -> None:
    (tmp_path / "a.d.ts").write_text("export interface A {\n    kind?: Renamed | 'x';\n    ok?: 'y';\n}\n")
    read = Declarations(tmp_path)
    assert read.values("a.d.ts", "A", "ok") == {"y"}
    with pytest.raises(Unresolved, match="Renamed is declared nowhere"):
        read.values("a.d.ts", "A", "kind")


def test_a_missing_import_target_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.d.ts").write_text("import { Gone } from './b.js';\nexport interface A {\n    kind?: Gone;\n}\n")
    with pytest.raises(Unresolved, match=r"no declaration file .*b\.d\.ts"):
        Declarations(tmp_path).values("a.d.ts", "A", "kind")


def test_what_it_cannot_read_stops_nothing_else_and_is_an_error_only_when_walked(tmp_path: Path) -> None:
    (tmp_path / "a.d.ts").write_text("""
export type Broken = ) 'a' | ;
declare function overload(x: { a: 'b' }): void;
declare const value: { readonly kind: 'c' };
export type Mapped<T> = { [K in keyof T]?: T[K] };
export interface After {
    [key: string]: unknown;
    (call: number): void;
    new (x: string): After;
    kind?: 'after';
}
""")
    read = Declarations(tmp_path)
    assert read.values("a.d.ts", "After", "kind") == {"after"}
    assert read.values("a.d.ts", "Mapped") == set()
    with pytest.raises(Unresolved, match="cannot read"):
        read.values("a.d.ts", "Broken")
