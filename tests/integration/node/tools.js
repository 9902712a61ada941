// The official OpenAI Node SDK calling tools and asking for JSON that
// matches a schema. Usage: node tools.js BASE_URL MODEL SPEC_FILE, where
// the spec is {"tools": [...], "schemas": [...], "per_schema": N}. Prints
// one JSON line of what came back; test_tools.py validates it.
const fs = require('fs');
const OpenAI = require('openai');

// Runs the thunks at most `width` at a time (the worker batches them).
async function pool(thunks, width) {
    const out = new Array(thunks.length);
    let next = 0;
    async function lane() {
        while (next < thunks.length) {
            const i = next++;
            out[i] = await thunks[i]();
        }
    }
    await Promise.all(Array.from({length : width}, lane));
    return out;
}

async function main() {
    const [baseURL, model, specFile] = process.argv.slice(2);
    const spec = JSON.parse(fs.readFileSync(specFile, 'utf8'));
    const client = new OpenAI({baseURL, apiKey : 'none', maxRetries : 0, timeout : 120000});
    const messages = [ {role : 'user', content : 'What is the weather in Paris?'} ];
    const tools = spec.tools;
    const base = {model, messages, max_tokens : 1500, temperature : 1};
    const calls = (m) => (m.tool_calls || []).map((c) => ({id : c.id, type : c.type, name : c.function.name,
                                                           arguments : c.function.arguments}));

    const whole = async (extra) => {
        const r = await client.chat.completions.create({...base, tools, ...extra});
        const c = r.choices[0];
        return {finish : c.finish_reason, content : c.message.content, calls : calls(c.message)};
    };
    // Streamed: delta.tool_calls folded by index, as an SDK user does.
    const streamed = async (extra) => {
        const s = await client.chat.completions.create({...base, tools, stream : true, ...extra});
        const acc = [];
        let finish = null, content = '', chunks = 0, pieces = 0;
        for await (const chunk of s) {
            for (const c of chunk.choices) {
                content += c.delta.content || '';
                for (const d of c.delta.tool_calls || []) {
                    chunks++;
                    if (!d.id && !(d.function && d.function.name))
                        pieces++; // a piece of the arguments alone
                    const a = acc[d.index] || (acc[d.index] = {id : '', type : '', name : '', arguments : ''});
                    a.id += d.id || '';
                    a.type += d.type || '';
                    a.name += (d.function && d.function.name) || '';
                    a.arguments += (d.function && d.function.arguments) || '';
                }
                if (c.finish_reason)
                    finish = c.finish_reason;
            }
        }
        return {finish, content, calls : acc, chunks, pieces};
    };
    const seeds = [ 1, 2, 3, 4, 5, 6 ];
    const out = {};
    out.required = await pool(seeds.map((seed) => () => whole({tool_choice : 'required', seed})), 6);
    out.required_stream = await pool(seeds.map((seed) => () => streamed({tool_choice : 'required', seed})), 6);
    const named = {tool_choice : {type : 'function', function : {name : tools[1].function.name}},
                   parallel_tool_calls : false};
    out.named = await pool(seeds.map((seed) => () => whole({...named, seed})), 6);
    out.named_stream = await pool(seeds.map((seed) => () => streamed({...named, seed})), 6);
    // The SDK's stream helper folds the chunks into one completion.
    const fin = await client.beta.chat.completions.stream({...base, tools, tool_choice : 'required', seed : 9})
                    .finalChatCompletion();
    out.helper = {finish : fin.choices[0].finish_reason, calls : calls(fin.choices[0].message)};
    // A history with a call and its answer goes back to the model.
    const first = out.required[0].calls[0];
    const history = [
        ...messages, {
            role : 'assistant',
            content : null,
            tool_calls :
                [ {id : first.id, type : 'function', function : {name : first.name, arguments : first.arguments}} ]
        },
        {role : 'tool', tool_call_id : first.id, content : '{"temperature": 21}'}
    ];
    const h = await client.chat.completions.create({...base, messages : history, tools, max_tokens : 8});
    out.history = {finish : h.choices[0].finish_reason};

    // Structured output: every schema, streamed and not.
    const answer = async (schema, i) => {
        const rf = {type : 'json_schema', json_schema : {name : 'answer', schema, strict : true}};
        if (i % 2 === 0) {
            const r = await client.chat.completions.create({...base, response_format : rf, seed : i});
            return {finish : r.choices[0].finish_reason, content : r.choices[0].message.content};
        }
        const s = await client.chat.completions.create({...base, response_format : rf, seed : i, stream : true});
        let content = '', finish = null;
        for await (const chunk of s)
            for (const c of chunk.choices) {
                content += c.delta.content || '';
                finish = c.finish_reason || finish;
            }
        return {finish, content};
    };
    const jobs = [];
    spec.schemas.forEach((schema, k) => {
        for (let i = 0; i < spec.per_schema; i++)
            jobs.push(() => answer(schema, k * 1000 + i));
    });
    out.schemas = await pool(jobs, 16);
    out.json_object = await pool([ 1, 2, 3 ].map((seed) => async () => {
        const r = await client.chat.completions.create(
            {...base, response_format : {type : 'json_object'}, seed, max_tokens : 300});
        return {finish : r.choices[0].finish_reason, content : r.choices[0].message.content};
    }), 3);
    try {
        await client.chat.completions.create({
            ...base,
            response_format :
                {type : 'json_schema', json_schema : {name : 'x', schema : {type : 'object', minProperties : 1}}}
        });
        out.refused = null;
    } catch (e) {
        out.refused = {status : e.status, param : e.param, message : e.message};
    }
    console.log(JSON.stringify(out));
}

main().catch((e) => {
    console.log(JSON.stringify({error : String(e), status : e.status || null}));
    process.exit(1);
});
