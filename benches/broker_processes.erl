%% The broker processes that spend the most CPU over 3 s, in cores: the VM's CPU time
%% over the window shared out by each process's reductions (an estimate: a reduction is
%% not a fixed cost). Run beside a bench: rabbitmqctl eval "$(cat benches/broker_processes.erl)"
Snap = fun() -> maps:from_list([{P, R} || P <- processes(), {reductions, R} <- [process_info(P, reductions)]]) end,
{RT0, _} = erlang:statistics(runtime), A = Snap(), timer:sleep(3000), B = Snap(), {RT1, _} = erlang:statistics(runtime),
D = lists:reverse(lists:keysort(2, [{P, R - maps:get(P, A, 0)} || {P, R} <- maps:to_list(B), P =/= self()])),
Tot = lists:sum([X || {_, X} <- D]),
Short = fun(Bin) -> lists:last(string:split(binary_to_list(Bin), ".", trailing)) end,
Name = fun(P) -> case process_info(P, registered_name) of {registered_name, N} -> atom_to_list(N); _ -> case process_info(P, dictionary) of {dictionary, Dict} -> case proplists:get_value(process_name, Dict) of {rabbit_amqqueue_process, {resource, _, queue, Q}} -> "queue " ++ Short(Q); {rabbit_channel, {C, N}} -> "channel " ++ lists:last(string:split(binary_to_list(C), ":")) ++ "/" ++ integer_to_list(N); {rabbit_reader, C} -> "reader " ++ lists:last(string:split(binary_to_list(C), ":")); {M, _} -> atom_to_list(M); _ -> "other" end; _ -> "gone" end end end,
Top = lists:sublist(D, 6),
CPU = (RT1 - RT0) / 3000,
lists:flatten(io_lib:format("cores ~.2f: ~s", [CPU, string:join([io_lib:format("~s ~.2f", [Name(P), CPU * R / max(Tot, 1)]) || {P, R} <- Top], "; ")])).
