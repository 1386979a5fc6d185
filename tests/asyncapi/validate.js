#!/usr/bin/env node
// Validates the exported schemas with independent tooling:
//   - the AsyncAPI document with the official parser (@asyncapi/parser), which
//     checks it against the AsyncAPI 3.0 spec, its Kafka bindings and refs;
//   - every <topic>/<event_type>.json as JSON Schema draft 2020-12 (ajv);
//   - sample payloads: each valid one must pass both its JSON Schema and the
//     payload of its AsyncAPI message; each invalid one must fail its JSON Schema.
//
// usage: node validate.js --asyncapi FILE --schemas DIR [--samples DIR] [--invalid-samples DIR]
// Sample dirs hold <topic>/<event_type>.json files, each a JSON array of payloads.
// On success prints a JSON summary of what the parser understood to stdout and
// exits 0; otherwise prints every diagnostic to stderr and exits 1 (2 on usage).
'use strict';

const fs = require('fs');
const path = require('path');
const { Parser } = require('@asyncapi/parser');
const Ajv2020 = require('ajv/dist/2020').default;
const AjvDraft07 = require('ajv').default;
const addFormats = require('ajv-formats').default;

const ANNOTATIONS = ['x-topic', 'x-event-type', 'x-aggregate-type', 'x-partition-key', 'x-kind'];

// Integer formats schemars emits; checked as ranges (JS numbers are exact to 2^53).
const INTEGER_FORMATS = {
  int8: [-(2 ** 7), 2 ** 7 - 1],
  int16: [-(2 ** 15), 2 ** 15 - 1],
  int32: [-(2 ** 31), 2 ** 31 - 1],
  int64: [-(2 ** 63), 2 ** 63 - 1],
  uint8: [0, 2 ** 8 - 1],
  uint16: [0, 2 ** 16 - 1],
  uint32: [0, 2 ** 32 - 1],
  uint64: [0, 2 ** 64 - 1],
  uint: [0, Infinity],
  int: [-Infinity, Infinity],
};
const NUMBER_FORMATS = ['float', 'double'];

function configure(ajv) {
  addFormats(ajv);
  for (const [name, [min, max]] of Object.entries(INTEGER_FORMATS)) {
    ajv.addFormat(name, { type: 'number', validate: (n) => Number.isInteger(n) && n >= min && n <= max });
  }
  for (const name of NUMBER_FORMATS) {
    ajv.addFormat(name, { type: 'number', validate: (n) => Number.isFinite(n) });
  }
  return ajv;
}

function parseArgs(argv) {
  const args = {};
  const known = new Set(['--asyncapi', '--schemas', '--samples', '--invalid-samples']);
  for (let i = 0; i < argv.length; i += 2) {
    if (!known.has(argv[i]) || argv[i + 1] === undefined) {
      usage(`unexpected argument ${argv[i]}`);
    }
    args[argv[i].slice(2)] = argv[i + 1];
  }
  if (!args.asyncapi || !args.schemas) usage('--asyncapi and --schemas are required');
  return args;
}

function usage(message) {
  console.error(`error: ${message}`);
  console.error('usage: node validate.js --asyncapi FILE --schemas DIR [--samples DIR] [--invalid-samples DIR]');
  process.exit(2);
}

// <dir>/<topic>/<name>.json -> [{ key: '<topic>/<name>', file, value }]
function jsonFiles(dir) {
  const found = [];
  for (const topic of fs.readdirSync(dir, { withFileTypes: true })) {
    if (!topic.isDirectory()) continue;
    for (const file of fs.readdirSync(path.join(dir, topic.name))) {
      if (!file.endsWith('.json')) continue;
      const full = path.join(dir, topic.name, file);
      found.push({ key: `${topic.name}/${file.slice(0, -5)}`, file: full, value: JSON.parse(fs.readFileSync(full, 'utf8')) });
    }
  }
  return found.sort((a, b) => a.key.localeCompare(b.key));
}

function formatErrors(errors) {
  return (errors || []).map((e) => `    ${e.instancePath || '/'} ${e.message} (${e.schemaPath})`).join('\n');
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const problems = [];
  const summary = { channels: {}, schemas: [], samples: 0, invalidSamples: 0, warnings: [] };

  // 1. AsyncAPI document.
  const source = path.resolve(args.asyncapi);
  const { document, diagnostics } = await new Parser().parse(fs.readFileSync(source, 'utf8'), { source });
  for (const d of diagnostics) {
    const where = d.path && d.path.length ? ` at ${d.path.join('.')}` : '';
    const line = `${d.code}: ${d.message}${where}`;
    if (d.severity === 0) problems.push(`asyncapi error ${line}`);
    else summary.warnings.push(line);
  }
  const messagePayloads = new Map();
  if (document) {
    for (const channel of document.channels().all()) {
      const kafka = channel.bindings().get('kafka');
      const entry = { address: channel.address(), kafkaTopic: kafka ? kafka.value().topic : null, messages: {} };
      for (const message of channel.messages().all()) {
        const key = message.bindings().get('kafka');
        entry.messages[message.name()] = {
          keyType: key && key.value().key ? key.value().key.type : null,
          headers: message.hasHeaders() ? Object.keys(message.headers().properties()).sort() : [],
          payloadTitle: message.payload() ? message.payload().title() : null,
        };
        messagePayloads.set(`${channel.address()}/${message.name()}`, message.payload().json());
      }
      summary.channels[channel.id()] = entry;
    }
    summary.operations = document.operations().all().map((op) => ({
      id: op.id(), action: op.action(), channel: op.channels().all().map((c) => c.address()),
    }));
  } else if (problems.length === 0) {
    problems.push('asyncapi: the parser returned no document');
  }

  // 2. JSON Schemas, draft 2020-12, strict mode (unknown keywords are errors).
  const ajv = configure(new Ajv2020({ strict: true, allErrors: true }));
  ajv.addVocabulary(ANNOTATIONS);
  const validators = new Map();
  for (const { key, file, value } of jsonFiles(args.schemas)) {
    if (value.$schema !== 'https://json-schema.org/draft/2020-12/schema') {
      problems.push(`${file}: $schema is ${JSON.stringify(value.$schema)}, expected draft 2020-12`);
    }
    if (!ajv.validateSchema(value)) {
      problems.push(`${file}: not a valid 2020-12 schema:\n${formatErrors(ajv.errors)}`);
      continue;
    }
    try {
      validators.set(key, ajv.compile(value));
      summary.schemas.push(key);
    } catch (e) {
      problems.push(`${file}: does not compile: ${e.message}`);
    }
    if (`${value['x-topic']}/${value['x-event-type']}` !== key) {
      problems.push(`${file}: x-topic/x-event-type do not match the file's path`);
    }
    if (document && !messagePayloads.has(key)) problems.push(`${file}: no AsyncAPI message for ${key}`);
  }
  for (const key of messagePayloads.keys()) {
    if (!validators.has(key)) problems.push(`asyncapi message ${key} has no JSON Schema file`);
  }

  // 3. Samples against both schemas (the AsyncAPI payload is the draft-07 dialect).
  const draft07 = configure(new AjvDraft07({ strict: false, allErrors: true }));
  if (args.samples) {
    for (const { key, file, value } of jsonFiles(args.samples)) {
      const validate = validators.get(key);
      if (!validate) {
        problems.push(`${file}: no schema ${key}`);
        continue;
      }
      const payloadSchema = messagePayloads.get(key);
      const validatePayload = payloadSchema ? draft07.compile(payloadSchema) : null;
      value.forEach((sample, i) => {
        summary.samples += 1;
        if (!validate(sample)) {
          problems.push(`${file}[${i}] fails ${key}.json:\n${formatErrors(validate.errors)}`);
        }
        if (validatePayload && !validatePayload(sample)) {
          problems.push(`${file}[${i}] fails the AsyncAPI payload of ${key}:\n${formatErrors(validatePayload.errors)}`);
        }
      });
    }
  }
  if (args['invalid-samples']) {
    for (const { key, file, value } of jsonFiles(args['invalid-samples'])) {
      const validate = validators.get(key);
      if (!validate) {
        problems.push(`${file}: no schema ${key}`);
        continue;
      }
      value.forEach((sample, i) => {
        summary.invalidSamples += 1;
        if (validate(sample)) problems.push(`${file}[${i}] should fail ${key}.json but passes`);
      });
    }
  }

  if (problems.length > 0) {
    console.error(problems.join('\n'));
    for (const w of summary.warnings) console.error(`asyncapi warning ${w}`);
    process.exit(1);
  }
  console.log(JSON.stringify(summary, null, 2));
}

main().catch((e) => {
  console.error(`error: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
});
