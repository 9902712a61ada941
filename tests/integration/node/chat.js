// The official OpenAI Node SDK against infergate: chat completions, streamed
// and not. Usage: node chat.js BASE_URL API_KEY MODEL
// Prints one JSON line: {"text": ..., "streamed": ..., "finish": ...}, with
// what the SDK saw of the model object, the chunks' null usage, a field
// the server refuses, and tools offered with and without tool_choice none.
const OpenAI = require('openai');

async function main() {
    const [baseURL, apiKey, model] = process.argv.slice(2);
    const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
    const messages = [{ role: 'user', content: 'Say hello.' }];
    const r = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
    const stream = await client.chat.completions.create({
        model, messages, max_tokens: 12, temperature: 0, stream: true,
        stream_options: { include_usage: true },
    });
    let streamed = '', finish = null, usage = null, null_usage = 0, chunks = 0;
    for await (const chunk of stream) {
        chunks++;
        if (chunk.usage) usage = chunk.usage;
        else if ('usage' in chunk && chunk.usage === null) null_usage++;
        for (const c of chunk.choices) {
            streamed += c.delta.content || '';
            if (c.finish_reason) finish = c.finish_reason;
        }
    }
    const m = await client.models.retrieve(model);
    const lp = await client.chat.completions.create({
        model, messages, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2,
    });
    // The SDK's stream helper folds chunks into one completion, logprobs too.
    const helper = await client.beta.chat.completions
                       .stream({
                           model,
                           messages,
                           max_tokens : 4,
                           temperature : 0,
                           logprobs : true,
                           top_logprobs : 2,
                       })
                       .finalChatCompletion();
    // The legacy functions are refused by name (tools are served).
    let refused = null;
    try {
        await client.chat.completions.create({model, messages, max_tokens : 2, functions : [ {name : 'f'} ]});
    } catch (e) {
        refused = {status : e.status, code : e.code, param : e.param};
    }
    // Tools offered (tool_choice auto by default) and with tool_choice
    // 'none' are served (tests/integration/test_tools.py calls them).
    const tools = [ {
        type : 'function',
        function : {name : 'get_weather', parameters : {type : 'object', properties : {}}}
    } ];
    const auto = await client.chat.completions.create({model, messages, max_tokens : 2, tools});
    const none =
        await client.chat.completions.create({model, messages, max_tokens : 2, tools, tool_choice : 'none'});
    console.log(JSON.stringify({
        tools_auto : auto.choices[0].finish_reason,
        tools_none : none.choices[0].finish_reason,
        text : r.choices[0].message.content,
        finish_plain : r.choices[0].finish_reason,
        refusal : r.choices[0].message.refusal,
        usage_plain : r.usage,
        streamed,
        finish,
        usage,
        chunks,
        null_usage,
        model_id : m.id,
        refused,
        logprobs : lp.choices[0].logprobs.content.map((e) => [e.token, e.logprob, e.top_logprobs.length]),
        helper_tokens : helper.choices[0].logprobs.content.map((e) => e.token),
        helper_text : helper.choices[0].message.content,
    }));
}

main().catch((e) => {
    console.log(JSON.stringify({ error: String(e), status: e.status || null }));
    process.exit(1);
});
