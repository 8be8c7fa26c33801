# grokking end to end (ctest example_grokking): the --quick configuration memorises, then groks,
# checked from its summary (train accuracy >= 99 % before test accuracy >= 99 %, the test loss
# rising above its start in between, a final test loss < 0.01, 1 to 7 key frequencies carrying
# the embedding, the restricted loss below the excluded loss at the end, a quarter of the MLP
# neurons explained by one frequency, the largest group's a key frequency) and writes its page; the
# same check rejects a run stopped before it generalises (its negative control); bad flags are
# refused before any work, naming the flag.
# cmake -DGROKKING=<program> -DWORK=<scratch dir> -P cli_test.cmake
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(run)
  execute_process(COMMAND "${GROKKING}" ${ARGN} WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "grokking ${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

# grokking_failures(VAR SUMMARY_FILE): VAR lists what the summary misses (empty when the run
# memorised and then generalised), each saying what was measured. Reads the contract's fields.
function(grokking_failures var file)
  file(READ "${file}" s)
  set(failed "")
  string(JSON memorized TYPE "${s}" memorized_step)
  string(JSON grokked TYPE "${s}" grokked_step)
  if(NOT memorized STREQUAL "NUMBER")
    list(APPEND failed "never memorised (train accuracy < 99 % throughout)")
  endif()
  if(NOT grokked STREQUAL "NUMBER")
    list(APPEND failed "never grokked (test accuracy < 99 % throughout)")
  endif()
  if(memorized STREQUAL "NUMBER" AND grokked STREQUAL "NUMBER")
    string(JSON m GET "${s}" memorized_step)
    string(JSON g GET "${s}" grokked_step)
    if(NOT m LESS g)
      list(APPEND failed "memorised at step ${m}, not before grokking at step ${g}")
    endif()
  endif()
  string(JSON peak GET "${s}" test_loss_peak loss)
  string(JSON first GET "${s}" curve 0 test_loss)
  if(NOT peak GREATER first)
    list(APPEND failed "the test loss never rose above its start ${first} (peak ${peak})")
  endif()
  string(JSON test_loss GET "${s}" test_loss)
  string(JSON test_accuracy GET "${s}" test_accuracy)
  if(NOT test_loss LESS 0.01 OR NOT test_accuracy GREATER_EQUAL 0.99)
    list(APPEND failed "final test loss ${test_loss}, accuracy ${test_accuracy}: wanted < 0.01 and >= 0.99")
  endif()
  string(JSON n_keys LENGTH "${s}" key_frequencies)
  if(n_keys LESS 1 OR n_keys GREATER 7)
    list(APPEND failed "${n_keys} key frequencies, wanted 1 to 7")
  endif()
  string(JSON restricted GET "${s}" restricted_loss)
  string(JSON excluded GET "${s}" excluded_loss)
  if(NOT restricted LESS excluded)
    list(APPEND failed "restricted loss ${restricted} is not below the excluded loss ${excluded}")
  endif()
  # The MLP neurons: at least a quarter explained >= 85 % by one frequency, the largest group's
  # frequency a key frequency of the embedding.
  string(JSON n_neurons LENGTH "${s}" neuron_frequency)
  string(JSON n_clusters LENGTH "${s}" neuron_clusters)
  set(explained 0)
  if(n_clusters GREATER 0)
    math(EXPR last "${n_clusters} - 1")
    foreach(i RANGE ${last})
      string(JSON n GET "${s}" neuron_clusters ${i} neurons)
      math(EXPR explained "${explained} + ${n}")
    endforeach()
    string(JSON top GET "${s}" neuron_clusters 0 frequency)
    string(JSON keys GET "${s}" key_frequencies)
    string(REGEX MATCHALL "[0-9]+" keys "${keys}")
    list(FIND keys "${top}" top_at)
    if(top_at EQUAL -1)
      list(APPEND failed "the largest neuron group's frequency ${top} is not a key frequency (${keys})")
    endif()
  endif()
  math(EXPR quarter "${n_neurons} / 4")
  if(explained LESS quarter)
    list(APPEND failed "${explained} of ${n_neurons} neurons explained >= 85 % by one frequency, wanted a quarter")
  endif()
  set(${var} "${failed}" PARENT_SCOPE)
endfunction()

run(--quick --summary quick.json --report quick.html --quiet)
grokking_failures(failed "${WORK}/quick.json")
if(failed)
  string(REPLACE ";" "\n  " failed "${failed}")
  message(FATAL_ERROR "grokking --quick did not grok:\n  ${failed}\n${out}")
endif()
foreach(part "memorised (train accuracy >= 99 %): step" "grokked (test accuracy >= 99 %): step" "key frequencies")
  string(FIND "${out}" "${part}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the output lacks '${part}':\n${out}")
  endif()
endforeach()
file(READ "${WORK}/quick.html" page)
foreach(id loss-chart accuracy-chart fourier-spectrum neuron-clusters progress-chart grokking-summary)
  string(FIND "${page}" "id=\"${id}\"" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the report lacks #${id}")
  endif()
endforeach()

# The negative control: stopped after memorising, the same check must fail.
run(--quick --steps 300 --summary short.json --quiet)
grokking_failures(failed "${WORK}/short.json")
if(NOT failed)
  message(FATAL_ERROR "a 300-step run passed the grokking check: the check cannot fail")
endif()
string(FIND "${failed}" "neurons explained >= 85 % by one frequency" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the neuron check accepted a 300-step run's neurons:\n  ${failed}")
endif()

# Bad flags are refused before any work, naming the flag or the setting.
foreach(case "--p;4|--p: must be an integer from 5 to 1000"
             "--p;91|--p must be a prime"
             "--train-fraction;1.5|--train-fraction: must be a number above 0 and below 1, got '1.5'"
             "--lr;0.5;--weight-decay;2|--lr 0.5 times --weight-decay 2 is 1 >= 1"
             "--steps;0|--steps"
             "--lr;-1|--lr"
             "--summary;.|--summary .: is a directory"
             "--summary;a.json;--report;a.json|name the same file"
             "--threads;0|--threads")
  string(REPLACE "|" ";" parts "${case}")
  list(POP_BACK parts expected)
  execute_process(COMMAND "${GROKKING}" ${parts} WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(FIND "${err}" "${expected}" at)
  if(rc EQUAL 0 OR at EQUAL -1 OR NOT out STREQUAL "")
    message(FATAL_ERROR "grokking ${parts}: wanted a refusal naming '${expected}' and no output, got ${rc}:\n${out}\n${err}")
  endif()
endforeach()
