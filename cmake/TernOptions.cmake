# Optional dependencies: AUTO uses one if found, ON fails the configure when it
# is missing, OFF never looks.
foreach(dep UCX VERBS CUDA)
  set(TERN_WITH_${dep} AUTO CACHE STRING "use ${dep}: AUTO, ON or OFF")
  set_property(CACHE TERN_WITH_${dep} PROPERTY STRINGS AUTO ON OFF)
  if(NOT TERN_WITH_${dep} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "TERN_WITH_${dep}='${TERN_WITH_${dep}}': must be AUTO, ON or OFF")
  endif()
endforeach()

# TERN_SANITIZE: a comma list handed to -fsanitize (address,undefined or thread).
set(TERN_SANITIZE "" CACHE STRING "sanitizers, e.g. address,undefined or thread")

function(tern_apply_sanitizers)
  if(TERN_SANITIZE)
    add_compile_options(-fsanitize=${TERN_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
    add_link_options(-fsanitize=${TERN_SANITIZE})
  endif()
endfunction()
