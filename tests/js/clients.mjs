// The JavaScript SDKs and the Vercel AI SDK, each configured with nothing but a base URL and a
// key, making every call tests/test_js_clients.py asserts on: all cases in one node process (its
// start-up and imports cost more than the calls), run side by side, one JSON line per case.
//
//   node clients.mjs '{"base": URL, "slow": URL, "translated": URL, "key": KEY}'
//
// `base` is a gateway on its embedded defaults; `slow` one whose only channel answers after its
// first-byte timeout, so every call there is the gateway's own 504 (with `x-should-retry: false`);
// `translated` one whose only channel speaks the message format, so a chat call there is translated.
// Each case's prompt names the case, so the test finds that case's requests among the upstream's.
import { readFileSync } from "node:fs";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { GoogleGenAI } from "@google/genai";
import { generateText, streamText, tool, isStepCount } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { createAnthropic } from "@ai-sdk/anthropic";
import { createGoogle } from "@ai-sdk/google";
import { z } from "zod";

globalThis.AI_SDK_LOG_WARNINGS = false; // its notes on unknown model names would fill the test's output

const { base, slow, translated, key } = JSON.parse(process.argv[2]);
const RESPONSES = "respmodel-4o", MESSAGES = "msgmodel-sonnet-4-5", CONTENT = "genmodel-2.0-flash";
const prompt = (name) => `Hello from case [${name}]`;

// The base URL conventions: openai's includes /v1, @anthropic-ai/sdk's does not (it adds /v1),
// @google/genai's is the host (it adds its API version, v1 by default); the AI SDK's providers
// all include the version, as their defaults do (…/v1, …/v1, …/v1beta).
const sdks = (url) => ({
  openai: new OpenAI({ baseURL: `${url}/v1`, apiKey: key }),
  anthropic: new Anthropic({ baseURL: url, apiKey: key }),
  genai: new GoogleGenAI({ apiKey: key, httpOptions: { baseUrl: url } }),
});
const providers = (url, settings = {}) => ({
  openai: createOpenAI({ baseURL: `${url}/v1`, apiKey: key, ...settings }).responses(RESPONSES),
  chat: createOpenAI({ baseURL: `${url}/v1`, apiKey: key, ...settings }).chat(RESPONSES),
  anthropic: createAnthropic({ baseURL: `${url}/v1`, apiKey: key, ...settings })(MESSAGES),
  google: createGoogle({ baseURL: `${url}/v1beta`, apiKey: key, ...settings })(CONTENT),
});

const cases = {};
const { openai, anthropic, genai } = sdks(base);

cases["openai generate"] = async (name) => {
  const answer = await openai.responses.create({ model: RESPONSES, input: prompt(name) });
  return { text: answer.output_text, status: answer.status, usage: answer.usage };
};
cases["openai stream"] = async (name) => {
  const stream = await openai.responses.create({ model: RESPONSES, input: prompt(name), stream: true });
  const kinds = [], deltas = [];
  let final;
  for await (const event of stream) {
    kinds.push(event.type);
    if (event.type === "response.output_text.delta") deltas.push(event.delta);
    if (event.type === "response.completed") final = event.response;
  }
  // A streamed response's final object has no output_text (the SDK adds it to whole answers only).
  const text = final.output.flatMap((item) => item.content ?? []).filter((part) => part.type === "output_text")
    .map((part) => part.text).join("");
  return { kinds, deltas, text, usage: final.usage };
};
cases["openai chat generate"] = async (name) => {
  const answer = await openai.chat.completions.create({ model: RESPONSES, messages: [{ role: "user", content: prompt(name) }] });
  return { text: answer.choices[0].message.content, finish_reason: answer.choices[0].finish_reason, usage: answer.usage };
};
cases["openai chat stream"] = async (name) => {
  // Without stream_options: no usage chunk comes (the gateway asks the upstream for its own count).
  const stream = await openai.chat.completions.create({ model: RESPONSES, stream: true,
                                                        messages: [{ role: "user", content: prompt(name) }] });
  const deltas = [], usages = [];
  let finish_reason;
  for await (const chunk of stream) {
    if (chunk.usage) usages.push(chunk.usage);
    for (const choice of chunk.choices) {
      if (choice.delta.content) deltas.push(choice.delta.content);
      finish_reason = choice.finish_reason ?? finish_reason;
    }
  }
  return { deltas, text: deltas.join(""), finish_reason, usages };
};
cases["anthropic generate"] = async (name) => {
  const message = await anthropic.messages.create({ model: MESSAGES, max_tokens: 64,
                                                    messages: [{ role: "user", content: prompt(name) }] });
  return { text: message.content[0].text, stop_reason: message.stop_reason, usage: message.usage };
};
cases["anthropic stream"] = async (name) => {
  const stream = anthropic.messages.stream({ model: MESSAGES, max_tokens: 64,
                                             messages: [{ role: "user", content: prompt(name) }] });
  const deltas = [];
  stream.on("text", (delta) => deltas.push(delta));
  const message = await stream.finalMessage();
  return { deltas, text: message.content[0].text, stop_reason: message.stop_reason, usage: message.usage };
};
cases["genai generate"] = async (name) => {
  const answer = await genai.models.generateContent({ model: CONTENT, contents: prompt(name) });
  return { text: answer.text, finish_reason: answer.candidates[0].finishReason, usage: answer.usageMetadata };
};
cases["genai stream"] = async (name) => {
  const deltas = [];
  let last;
  for await (const chunk of await genai.models.generateContentStream({ model: CONTENT, contents: prompt(name) })) {
    deltas.push(chunk.text);
    last = chunk;
  }
  return { deltas, text: deltas.join(""), usage: last.usageMetadata };
};

const weather = tool({
  description: "The weather in a city",
  inputSchema: z.object({ city: z.string().describe("the city's name") }),
  execute: async ({ city }) => ({ city, celsius: 21 }),
});
const steps = (result) => result.steps.map((step) => ({
  finishReason: step.finishReason, text: step.text,
  toolCalls: step.toolCalls.map((call) => ({ toolName: call.toolName, input: call.input })),
  toolResults: step.toolResults.map((done) => done.output),
}));

const translatedChat = createOpenAI({ baseURL: `${translated}/v1`, apiKey: key }).chat(MESSAGES);
for (const [provider, model] of Object.entries({ ...providers(base), "chat translated": translatedChat })) {
  cases[`ai ${provider} generateText`] = async (name) => {
    const result = await generateText({ model, prompt: prompt(name) });
    return { text: result.text, finishReason: result.finishReason, usage: result.usage };
  };
  cases[`ai ${provider} streamText`] = async (name) => {
    let failure;
    const result = streamText({ model, prompt: prompt(name), onError: ({ error }) => { failure = error; } });
    const deltas = [];
    for await (const delta of result.textStream) deltas.push(delta);
    if (failure) throw failure;
    return { deltas, text: await result.text, finishReason: await result.finishReason, usage: await result.usage };
  };
  cases[`ai ${provider} tool loop`] = async (name) => {
    const result = await generateText({ model, prompt: `${prompt(name)}: what is the weather in Paris?`,
                                        tools: { weather }, stopWhen: isStepCount(3) });
    return { text: result.text, finishReason: result.finishReason, steps: steps(result) };
  };
}

// The gateway's 504 says `x-should-retry: false`: the openai and anthropic SDKs obey it (their
// default is 2 retries); @google/genai retries only with retryOptions, and then by status alone;
// the AI SDK retries by status alone (maxRetries 2 by default), so only maxRetries: 0 sends once.
const late = sdks(slow);
cases["openai 504"] = (name) => late.openai.responses.create({ model: RESPONSES, input: prompt(name) });
cases["anthropic 504"] = (name) => late.anthropic.messages.create({
  model: MESSAGES, max_tokens: 64, messages: [{ role: "user", content: prompt(name) }] });
cases["genai 504"] = (name) => late.genai.models.generateContent({ model: CONTENT, contents: prompt(name) });
cases["genai 504 with retryOptions"] = (name) => new GoogleGenAI({
  apiKey: key, httpOptions: { baseUrl: slow, retryOptions: { attempts: 2, initialDelay: 0.01, jitter: 0 } },
}).models.generateContent({ model: CONTENT, contents: prompt(name) });
for (const [provider, model] of Object.entries(providers(slow))) {
  cases[`ai ${provider} 504 maxRetries 0`] = (name) => generateText({ model, prompt: prompt(name), maxRetries: 0 });
}
// Its default retries, with the pause before each shortened: it waits `retry-after-ms` when an
// answer carries one (else 2 s, then 4 s); the header, added to the answer on the client's side,
// changes how long it waits, not whether it sends again.
const soon = async (url, init) => {
  const answer = await fetch(url, init);
  const headers = new Headers(answer.headers);
  headers.set("retry-after-ms", "10");
  return new Response(answer.body, { status: answer.status, statusText: answer.statusText, headers });
};
cases["ai openai 504 default retries"] = (name) => generateText({
  model: providers(slow, { fetch: soon }).openai, prompt: prompt(name) });

const failure = (error) => ({
  name: error?.constructor?.name, message: String(error?.message ?? error).slice(0, 500),
  status: error?.status ?? error?.statusCode ?? error?.lastError?.statusCode ?? null,
  attempts: error?.errors?.length ?? null,
});
const version = (name) =>
  JSON.parse(readFileSync(new URL(`./node_modules/${name}/package.json`, import.meta.url))).version;
console.log(JSON.stringify({ case: "versions", ok: true, value: Object.fromEntries(
  ["openai", "@anthropic-ai/sdk", "@google/genai", "ai", "@ai-sdk/openai", "@ai-sdk/anthropic", "@ai-sdk/google", "zod"]
    .map((name) => [name, version(name)])) }));
await Promise.all(Object.entries(cases).map(async ([name, run]) => {
  let line;
  try {
    line = { case: name, ok: true, value: await run(name) };
  } catch (error) {
    line = { case: name, ok: false, error: failure(error) };
  }
  console.log(JSON.stringify(line));
}));
